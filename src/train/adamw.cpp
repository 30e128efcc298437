#include "moe/train/adamw.h"

#include <ATen/ATen.h>

namespace moe::train {

FusedAdamW::FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps)
    : groups_(std::move(groups)), beta1_(beta1), beta2_(beta2), eps_(eps) {
  for (const auto& g : groups_) {
    auto& st = state_.emplace_back();
    for (const auto& p : g.params) {
      st.push_back({at::zeros_like(p, at::MemoryFormat::Preserve),
                    at::zeros_like(p, at::MemoryFormat::Preserve),
                    at::zeros({}, p.options().dtype(at::kFloat))});
    }
  }
}

void FusedAdamW::step(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<at::Tensor> params, grads, m, v, steps;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& p = groups_[g].params[i];
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
      m.push_back(state_[g][i].exp_avg);
      v.push_back(state_[g][i].exp_avg_sq);
      steps.push_back(state_[g][i].step);
    }
    if (params.empty()) continue;
    // As torch.optim's fused path: count the step first, take it back if it was skipped.
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1_, beta2_,
                      groups_[g].weight_decay, eps_, /*amsgrad=*/false, /*maximize=*/false,
                      grad_scale, found_inf);
    if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
  }
}

void FusedAdamW::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) p.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, AdamWState*>> FusedAdamW::named_state() {
  std::vector<std::pair<std::string, AdamWState*>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      out.emplace_back(groups_[g].names[i], &state_[g][i]);
    }
  }
  return out;
}

}  // namespace moe::train
