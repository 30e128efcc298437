// AdamW as one fused multi-tensor update per parameter group (at::_fused_adamw_, which LibTorch
// implements for CPU and CUDA), the same math as torch.optim.AdamW(fused=True). Optional
// grad_scale / found_inf make fp16 unscaling and overflow skipping part of the same kernel.
// State (exp_avg, exp_avg_sq, step) is addressable by parameter name for checkpoints.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace moe::train {

struct AdamWGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
};

struct AdamWState {                         // of one parameter
  torch::Tensor exp_avg, exp_avg_sq, step;  // step: fp32 scalar, as PyTorch keeps it
};

class FusedAdamW {
 public:
  FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps);
  // One update at learning rate `lr`. Parameters without a gradient are left alone.
  void step(double lr, const std::optional<torch::Tensor>& grad_scale = std::nullopt,
            const std::optional<torch::Tensor>& found_inf = std::nullopt);
  void zero_grad();
  std::vector<std::pair<std::string, AdamWState*>> named_state();

 private:
  std::vector<AdamWGroup> groups_;
  std::vector<std::vector<AdamWState>> state_;
  double beta1_, beta2_, eps_;
};

}  // namespace moe::train
