#include "moe/train/zero.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "moe/dist/process_group.h"

namespace moe::train {

ZeroPartition::ZeroPartition(dist::ProcessGroup& group, int64_t stage,
                             std::vector<std::string> names, std::vector<torch::Tensor> params,
                             int64_t bucket_bytes)
    : group_(group),
      stage_(stage),
      bucket_bytes_(bucket_bytes),
      names_(std::move(names)),
      params_(std::move(params)),
      owner_(params_.size(), 0) {
  // Largest first onto the least-loaded rank: deterministic, so every rank computes the same.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(group.size()), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = static_cast<int64_t>(r);
    load[r] += params_[i].numel();
  }
}

bool ZeroPartition::owns(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return owner_[i] == group_.rank();
  }
  return false;
}

int64_t ZeroPartition::owned_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] == group_.rank()) n += params_[i].numel();
  }
  return n;
}

void ZeroPartition::drop_foreign_gradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != group_.rank()) params_[i].mutable_grad() = torch::Tensor();
  }
}

torch::Tensor ZeroPartition::clip_global(const std::vector<torch::Tensor>& own_grads,
                                         double max_norm) {
  auto sq = torch::zeros({1}, torch::kDouble);
  if (!own_grads.empty()) {
    sq += at::stack(at::_foreach_norm(own_grads, 2)).to(torch::kDouble).square().sum().cpu();
  }
  group_.allreduce_sum(sq);
  auto norm = sq.sqrt().to(torch::kFloat).squeeze();
  if (std::isfinite(max_norm) && !own_grads.empty()) {
    auto n = norm.to(own_grads.front().device());
    auto coef = (max_norm / (n + 1e-6)).clamp_max(1.0);
    coef = at::where(n.isfinite(), coef, at::ones_like(coef));
    at::_foreach_mul_(own_grads, coef);
  }
  return norm;
}

void ZeroPartition::broadcast_updates() {
  torch::NoGradGuard no_grad;
  for (int64_t root = 0; root < group_.size(); ++root) {
    // The root's parameters in buckets of at most bucket_bytes_.
    std::vector<size_t> mine;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == root) mine.push_back(i);
    }
    size_t a = 0;
    while (a < mine.size()) {
      size_t b = a;
      int64_t bytes = 0;
      while (b < mine.size() &&
             (b == a || bytes + static_cast<int64_t>(params_[mine[b]].nbytes()) <= bucket_bytes_)) {
        bytes += static_cast<int64_t>(params_[mine[b]].nbytes());
        ++b;
      }
      std::vector<torch::Tensor> parts;
      for (size_t k = a; k < b; ++k) parts.push_back(params_[mine[k]].detach().reshape({-1}));
      auto flat = torch::cat(parts);
      group_.broadcast(flat, root);
      int64_t offset = 0;
      for (size_t k = a; k < b; ++k) {
        auto& p = params_[mine[k]];
        p.detach().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
      a = b;
    }
  }
}

std::unique_ptr<FusedAdamW> ZeroPartition::gather_optimizer(FusedAdamW& mine,
                                                            std::vector<AdamWGroup> all_groups,
                                                            double beta1, double beta2,
                                                            double eps) {
  std::map<std::string, AdamWState*> own;
  for (auto& [name, st] : mine.named_state()) own[name] = st;
  std::unique_ptr<FusedAdamW> full;
  std::map<std::string, AdamWState*> target;
  if (group_.rank() == 0) {
    full = std::make_unique<FusedAdamW>(std::move(all_groups), beta1, beta2, eps);
    for (auto& [name, st] : full->named_state()) target[name] = st;
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = names_[i];
    const bool owner = owner_[i] == group_.rank();
    const AdamWState* src = owner ? own.at(name) : nullptr;
    for (int which = 0; which < 3; ++which) {
      const auto pick = [&](const AdamWState& s) -> const torch::Tensor& {
        return which == 0 ? s.exp_avg : which == 1 ? s.exp_avg_sq : s.step;
      };
      const torch::Tensor like = which == 2 ? torch::zeros({}, torch::kFloat)
                                            : torch::empty_like(params_[i], torch::kFloat);
      torch::Tensor buf = owner ? pick(*src).detach().to(torch::kCPU).clone()
                                : torch::empty_like(like, like.options().device(torch::kCPU));
      group_.broadcast(buf, owner_[i]);
      if (group_.rank() == 0) const_cast<torch::Tensor&>(pick(*target.at(name))).copy_(buf);
    }
  }
  return full;
}

}  // namespace moe::train
