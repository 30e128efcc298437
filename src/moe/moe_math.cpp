#include "moe/moe/moe_math.h"

#include <ATen/ATen.h>

#include <cmath>

namespace moe::moe {

std::pair<at::Tensor, int64_t> global_load_counts(const at::Tensor& tokens_per_expert,
                                                  bool training, const LoadReduction& reduction) {
  if (!reduction.sum_over_ranks || !training) return {tokens_per_expert, 1};
  at::Tensor counts = tokens_per_expert.clone();
  reduction.sum_over_ranks(counts);
  return {counts, reduction.world_size};
}

at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                               int64_t top_k, int64_t total_tokens) {
  const int64_t T = total_tokens > 0 ? total_tokens : probs.size(0), E = probs.size(1);
  at::Tensor f =
      tokens_per_expert.to(at::kFloat) / static_cast<double>(std::max<int64_t>(1, T * top_k));
  at::Tensor P = probs.mean(0);
  return (f.detach() * P).sum() * static_cast<double>(E);
}

at::Tensor router_z_loss(const at::Tensor& logits) {
  return at::logsumexp(logits, -1).square().mean();
}

int64_t expert_capacity(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                        double capacity_factor) {
  if (capacity_factor <= 0) return num_tokens * top_k;
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(num_tokens * top_k) / num_experts));
}

}  // namespace moe::moe
