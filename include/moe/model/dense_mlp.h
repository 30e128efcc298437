// The dense feed-forward kind: a SwiGLU MLP (registered as a block's "mlp").
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/config/lora.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"

namespace moe::model {

// A dense SwiGLU FFN (the non-MoE layers of Qwen3-MoE): down(silu(gate(x)) * up(x)), or GeGLU
// (Gemma 4) with gelu_tanh in place of silu, or non-gated down(relu(up(x))^2) (Nemotron-H; no
// gate_proj); weights in nn.Linear's [out, in] layout.
class DenseMlpImpl : public torch::nn::Module {
 public:
  DenseMlpImpl(int64_t hidden, int64_t ffn, double init_std, double out_init_std,
               const layers::LoraSpec& lora = {}, const config::LoraTargets& targets = {},
               bool gated = true);
  torch::Tensor forward(const torch::Tensor& x);
  void merge_lora();
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  layers::LoraAdapter lora_gate{nullptr}, lora_up{nullptr}, lora_down{nullptr};
  layers::QuantizedWeightPtr gate_4bit, up_4bit, down_4bit;  // a 4-bit frozen base
  bool fused_swiglu = false;  // kernels/swiglu.h's fused op (SwiGLU or GeGLU) where allowed
  bool geglu = false;         // gelu_tanh(gate) * up (moe.activation geglu) instead of SwiGLU
  bool relu2 = false;         // relu(up)^2, no gate (moe.activation relu2)
};
TORCH_MODULE(DenseMlp);

}  // namespace moe::model
