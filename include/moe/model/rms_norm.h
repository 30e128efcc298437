// RMSNorm over the last dimension (eps from model.norm_eps), weight initialised to ones.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

namespace moe::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

}  // namespace moe::model
