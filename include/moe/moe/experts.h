// Experts: E SwiGLU MLPs held as stacked weights, applied to expert-contiguous rows.
//   y = (silu(x W_gate[e]) * (x W_up[e])) W_down[e]
// or non-gated (moe.activation relu2, Nemotron-H): y = relu(x W_up[e])^2 W_down[e], no W_gate.
#pragma once

#include <memory>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "moe/config/choices.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
#include "moe/layers/offload_ring.h"

namespace moe::moe {

struct ExpertsOptions {
  int64_t num_experts = 8;
  int64_t hidden_size = 0;
  int64_t ffn_size = 0;
  double expert_dropout =
      0.0;  // moe.expert_dropout on the SwiGLU activations (Switch's "expert dropout")
  double init_std = 0.02;
  double output_init_std = 0.02;
  // CUDA + bf16 activations + Hopper or newer + rows of a multiple of 8: one at::_grouped_mm per
  // projection (no host sync on the counts). Off, or elsewhere: one GEMM per expert.
  bool grouped_mm = true;
  // silu(gate) * up (GeGLU's gelu_tanh(gate) * up) as one fused CUDA kernel (kernels/swiglu.h)
  // where the operands allow; set when the model is built (moe.kernels not `reference` on a CUDA
  // device).
  bool fused_swiglu = false;
  // On the grouped-GEMM path: gate and up as one GEMM over the weights' bf16 copies concatenated
  // to [E, d, 2f] (moe.fused_gate_up), the activation on its packed [N, 2f] output; not where the
  // weights are bf16 already (fuses_gate_up()).
  bool fused_gate_up = true;
  // Expert parallelism: this module holds experts [first_expert, first_expert + local_experts)
  // of num_experts (local_experts < 0: all). Initialised as the whole stack and sliced, so every
  // expert starts with the values it has without expert parallelism.
  int64_t first_expert = 0, local_experts = -1;
  // LoRA (config/lora.h): one adapter per expert over [gate | up] and/or over down; r = 0: none.
  layers::LoraSpec lora_gate_up, lora_down;
  bool bias = false;  // b_gate, b_up, b_down (gpt-oss's gate_up_proj_bias and down_proj_bias)
  // moe.activation: silu(gate) * up, or gpt-oss's clamped form (kernels/clamped_swiglu.h).
  config::ExpertActivation activation = config::ExpertActivation::kSwiglu;
  double swiglu_limit = 7.0, swiglu_alpha = 1.702;
};

class ExpertsImpl : public torch::nn::Module {
 public:
  explicit ExpertsImpl(const ExpertsOptions& opt);
  // x [N, d] in expert order, tokens_per_expert [E] -> [N, d].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& tokens_per_expert);
  // Whether forward(x) takes the grouped-GEMM path.
  bool uses_grouped_mm(const torch::Tensor& x) const;
  // Whether that path computes gate and up in one GEMM: fused_gate_up and weights that are not
  // bf16 already (whose bf16 copies exist anyway; bf16 weights are read in place by two GEMMs).
  bool fuses_gate_up() const;

  torch::Tensor w_gate;                      // [E, d, f] (E: the experts held here); relu2: none
  torch::Tensor w_up;                        // [E, d, f]
  torch::Tensor w_down;                      // [E, f, d]
  torch::Tensor b_gate, b_up, b_down;        // [E, f], [E, f], [E, d] (bias only)
  layers::ExpertLora lora_gate_up{nullptr};  // [E, d, r] x [E, r, 2f]: gate's and up's update
  layers::ExpertLora lora_down{nullptr};     // [E, f, r] x [E, r, d]
  // A 4-bit frozen base (quantization.load_in_4bit): the stacks above are emptied and each
  // expert's matrices live here, dequantized per projection right before its GEMM.
  layers::QuantizedWeightPtr gate_4bit, up_4bit, down_4bit;
  // Folds the adapters into w_gate / w_up / w_down and zeroes them (export-hf --merge).
  void merge_lora();

  // The expert offload tier (moe.offload_experts): the frozen base (the 16-bit stacks, or the
  // 4-bit states) joins `ring` as MoE layer `layer`: it stays in host memory, and each GEMM reads
  // the ring's device copy. Call before the module moves to the device.
  void offload_to(const std::shared_ptr<layers::OffloadRing>& ring, int64_t layer);
  bool offloaded() const { return ring_ != nullptr; }
  // Module::to, except that offloaded stacks stay where they are (in host memory).
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;

 private:
  // The gate_up adapter's update [n, 2f] added to gate and up (relu2: [n, f] to up alone).
  void add_gate_up_update(torch::Tensor& gate, torch::Tensor& up, const torch::Tensor& delta) const;
  // The gated activation of moe.activation on gate and up [n, f].
  torch::Tensor activation(const torch::Tensor& gate, const torch::Tensor& up) const;
  // x [n, d|f] through expert e's gate, up or down matrix (16-bit stacks, offloaded or not).
  torch::Tensor expert_matmul(const torch::Tensor& x, const std::vector<torch::Tensor>& stack,
                              const layers::OffloadedPlace& place, int64_t e) const;
  ExpertsOptions opt_;
  std::shared_ptr<layers::OffloadRing> ring_;
  // Offloaded 16-bit stacks: where w_gate, w_up and w_down sit in the ring's list.
  layers::OffloadedPlace gate_place_, up_place_, down_place_;
};
TORCH_MODULE(Experts);

// [a | b] along the last dimension in bf16, each cast straight into one buffer (the one-GEMM
// gate-up weights); gradients flow back to a and b in their own dtypes.
torch::Tensor concat_bf16(const torch::Tensor& a, const torch::Tensor& b);

// Whether `device` takes the grouped-GEMM path: CUDA sm_90 only. _grouped_mm's fast kernels
// exist for sm_90 and sm_100, but sm_100 has an open PyTorch bug (pytorch/pytorch#172439:
// garbage weight gradients for experts without tokens), and other devices fall back to a
// host-synced loop.
bool experts_grouped_mm_supported(const torch::Device& device);

}  // namespace moe::moe
