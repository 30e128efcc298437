// The Mamba-2 token mixer of Nemotron-H and Granite 4.0-H (the layers model.layer_types marks
// "mamba"), registered as a block's "mamba" with transformers' parameter names: in_proj to
// [z | x, B, C | dt], a causal depthwise conv1d with bias + SiLU over (x, B, C),
// dt = softplus(dt + dt_bias) within the time-step limits, A = -exp(A_log), the selective scan
// with the D skip (model/mamba2_scan.h), an RMSNorm per group of x silu(z) (norm after the gate,
// as mamba-ssm's norm_before_gate=False), out_proj.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
#include "moe/model/decode_cache.h"
#include "moe/model/mamba2_scan.h"

namespace moe::model {

// The conv1d's tensors under transformers' names (conv1d.weight [C, 1, K], conv1d.bias [C]).
class ConvWeightsImpl : public torch::nn::Module {
 public:
  ConvWeightsImpl(int64_t channels, int64_t kernel, bool bias);
  torch::Tensor weight, bias;  // bias undefined without model.mamba_conv_bias
};
TORCH_MODULE(ConvWeights);

// A module holding the gated norm's weight as "weight" (norm.weight).
class NormWeightImpl : public torch::nn::Module {
 public:
  explicit NormWeightImpl(int64_t width) {
    weight = register_parameter("weight", torch::ones({width}));
  }
  torch::Tensor weight;
};
TORCH_MODULE(NormWeight);

struct Mamba2Options {
  int64_t hidden = 0;
  int64_t heads = 1, head_dim = 0, state_size = 0, groups = 1;
  int64_t conv_kernel = 4, chunk = 128;
  bool conv_bias = true, proj_bias = false;
  double dt_min = 0.0, dt_max = 0.0;  // the time step's limits; dt_max 0 = unbounded
  double norm_eps = 1e-5;
  double init_std = 0.02, out_init_std = 0.02;
  layers::LoraSpec lora;                   // r = 0: no adapters
  bool lora_in = false, lora_out = false;  // lora.target_modules in_proj / out_proj
};

class Mamba2MixerImpl : public torch::nn::Module {
 public:
  explicit Mamba2MixerImpl(const Mamba2Options& opt);
  torch::Tensor forward(const torch::Tensor& x);  // [B, S, d] -> [B, S, d]
  // positions [B, S] restarting at 0 per document; undefined: one sequence.
  void set_documents(const torch::Tensor& positions) { positions_ = positions; }
  // Generation: the following forwards continue from `cache`'s conv and recurrent states.
  void set_decode(const DecodeStep* step, LayerCache* cache) {
    step_ = step;
    cache_ = cache;
    positions_ = torch::Tensor();
  }
  const Mamba2Options& options() const { return opt_; }

  torch::Tensor dt_bias, A_log, D;  // [heads]
  torch::nn::Linear in_proj{nullptr};
  ConvWeights conv1d{nullptr};
  NormWeight norm{nullptr};  // [heads x head_dim], ones
  torch::nn::Linear out_proj{nullptr};
  // A 4-bit frozen base (quantization.load_in_4bit, projections without biases): in_proj and
  // out_proj emptied, their matrices held here.
  layers::QuantizedWeightPtr in_proj_4bit, out_proj_4bit;
  layers::LoraAdapter lora_in{nullptr}, lora_out{nullptr};  // on in_proj / out_proj
  void merge_lora();  // the adapters folded into in_proj / out_proj and zeroed

 private:
  // A projection: its base (16- or 4-bit, bias included), plus its adapter's update.
  torch::Tensor project(const torch::Tensor& x, torch::nn::Linear& base,
                        const layers::QuantizedWeightPtr& q, layers::LoraAdapter& adapter);
  torch::Tensor convolve(const torch::Tensor& xbc);
  SsdOutput scan(const SsdInputs& in);
  Mamba2Options opt_;
  torch::Tensor positions_;
  const DecodeStep* step_ = nullptr;
  LayerCache* cache_ = nullptr;
};
TORCH_MODULE(Mamba2Mixer);

// x silu(gate), then an RMSNorm over each of `groups` equal slices of the last dimension, times
// `weight`, in fp32 (transformers' NemotronHRMSNormGated / MambaRMSNormGated).
torch::Tensor group_gated_rms_norm(const torch::Tensor& x, const torch::Tensor& gate,
                                   const torch::Tensor& weight, int64_t groups, double eps);

}  // namespace moe::model
