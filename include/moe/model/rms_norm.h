// RMSNorm over the last dimension (eps from model.norm_eps), weight initialised to ones; or
// zero-centred (model.zero_centered_norm: Qwen3-Next / Qwen3.5, Gemma): times 1 + weight, the
// weight initialised to zeros.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

namespace moe::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, bool zero_centered = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  bool zero_centered_;
};
TORCH_MODULE(RMSNorm);

}  // namespace moe::model
