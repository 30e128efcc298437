// Gated DeltaNet, the linear-attention token mixer of Qwen3-Next and Qwen3.5 (the layers that
// model.layer_types marks "linear_attention"), registered as a block's "linear_attn" with
// transformers' parameter names: input projections to q, k, v, z, b, a (fused per key-head
// group as Qwen3-Next saves them, or split as Qwen3.5 does), a causal depthwise conv1d + SiLU
// over q, k, v, beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), the gated delta rule
// (model/gated_delta_rule.h), an RMSNorm per value head gated by silu(z), out_proj.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
#include "moe/model/decode_cache.h"
#include "moe/model/gated_delta_rule.h"

namespace moe::model {

// A module holding one tensor named "weight": the conv1d's and the gated norm's, so that their
// parameters carry transformers' names (conv1d.weight, norm.weight).
class WeightOnlyImpl : public torch::nn::Module {
 public:
  explicit WeightOnlyImpl(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  torch::Tensor weight;
};
TORCH_MODULE(WeightOnly);

struct GatedDeltaNetOptions {
  int64_t hidden = 0;
  int64_t key_heads = 1, value_heads = 1;  // value_heads a multiple of key_heads
  int64_t key_head_dim = 0, value_head_dim = 0;
  int64_t conv_kernel = 4;
  bool fused_projections = false;  // Qwen3-Next's in_proj_qkvz / in_proj_ba
  double norm_eps = 1e-6;
  double init_std = 0.02, out_init_std = 0.02;
  layers::LoraSpec lora;  // r = 0: no adapters
  // Which projections carry adapters (lora.target_modules by their names; the layout's only).
  bool lora_qkv = false, lora_z = false, lora_b = false, lora_a = false;
  bool lora_qkvz = false, lora_ba = false, lora_out = false;
};

class GatedDeltaNetImpl : public torch::nn::Module {
 public:
  explicit GatedDeltaNetImpl(const GatedDeltaNetOptions& opt);
  torch::Tensor forward(const torch::Tensor& x);  // [B, S, d] -> [B, S, d]
  // positions [B, S] restarting at 0 per document (attention's document layout); undefined:
  // one sequence.
  void set_documents(const torch::Tensor& positions) { positions_ = positions; }
  // Generation (model/decode_cache.h): the following forwards continue from `cache`'s conv and
  // recurrent states and leave theirs there; null: the ordinary forward.
  void set_decode(const DecodeStep* step, LayerCache* cache) {
    step_ = step;
    cache_ = cache;
    positions_ = torch::Tensor();
  }

  // Qwen3.5's split projections, or Qwen3-Next's fused ones (the others stay null).
  torch::nn::Linear in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr},
      in_proj_a{nullptr};
  torch::nn::Linear in_proj_qkvz{nullptr}, in_proj_ba{nullptr};
  WeightOnly conv1d{nullptr};    // [2 key_dim + value_dim, 1, conv_kernel]
  torch::Tensor dt_bias, A_log;  // [value_heads]
  WeightOnly norm{nullptr};      // [value_head_dim], ones
  torch::nn::Linear out_proj{nullptr};
  // A 4-bit frozen base (quantization.load_in_4bit): the projections emptied, their matrices here.
  layers::QuantizedWeightPtr in_proj_qkv_4bit, in_proj_z_4bit, in_proj_b_4bit, in_proj_a_4bit;
  layers::QuantizedWeightPtr in_proj_qkvz_4bit, in_proj_ba_4bit, out_proj_4bit;
  // LoRA adapters on the projections of the same names (PEFT's in_proj_qkv ... out_proj).
  layers::LoraAdapter lora_qkv{nullptr}, lora_z{nullptr}, lora_b{nullptr}, lora_a{nullptr};
  layers::LoraAdapter lora_qkvz{nullptr}, lora_ba{nullptr}, lora_out{nullptr};
  void merge_lora();  // the adapters folded into their projections and zeroed

 private:
  struct Projected {
    torch::Tensor qkv, z, b, a;  // [B, S, 2 kd + vd], [B, S, Hv, dv], [B, S, Hv] x2
  };
  Projected project(const torch::Tensor& x);
  void register_adapters(int64_t d, int64_t conv, int64_t vd);  // after the projections
  // One projection: its base (16- or 4-bit) plus its adapter's update.
  static torch::Tensor linear(const torch::Tensor& x, torch::nn::Linear& base,
                              const layers::QuantizedWeightPtr& q, layers::LoraAdapter& adapter);
  // The conv1d + SiLU over qkv [B, S, C] continuing from the cached inputs (generation), or
  // alone with the document resets.
  torch::Tensor convolve(const torch::Tensor& qkv);
  // The delta rule from the cached state (generation), or from zeros.
  torch::Tensor delta_rule(const DeltaRuleInputs& in);
  GatedDeltaNetOptions opt_;
  torch::Tensor positions_;
  const DecodeStep* step_ = nullptr;
  LayerCache* cache_ = nullptr;
};
TORCH_MODULE(GatedDeltaNet);

// RMSNorm over the last dimension of x in fp32, times `weight`, times silu(gate) (transformers'
// Qwen3NextRMSNormGated, fla's FusedRMSNormGated), in x's dtype.
torch::Tensor gated_rms_norm(const torch::Tensor& x, const torch::Tensor& gate,
                             const torch::Tensor& weight, double eps);

}  // namespace moe::model
