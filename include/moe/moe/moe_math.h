// Pure MoE math on plain values: no config, no modules. Shapes and formulas documented here
// are the contract the CUDA kernels are tested against.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include <ATen/core/Tensor.h>

namespace moe::moe {

// Switch/GShard load-balancing loss.
//   probs:             [T, E] fp32 router probabilities (softmax, or normalised sigmoid scores)
//   tokens_per_expert: [E] int64 assignments per expert (over all k slots)
//   aux = E * sum_e f_e * P_e,  f_e = tokens_per_expert[e] / (T * k),  P_e = mean_t probs[t, e]
// Minimised (= 1) by a uniform load. Gradient flows through P only, as in Switch.
// `total_tokens` (0 = T): the tokens the counts were taken over (data parallel: all ranks').
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                               int64_t top_k, int64_t total_tokens = 0);

// Data parallel: the load-balancing loss takes its token fractions f_e over the global
// micro-batch (every rank's), so that the loss and its gradient do not depend on the world size
// (P_e stays local: the mean over ranks of f . P_local is f . P_global). The router receives its
// reduction when it is built (RouterOptions::load_reduction), as Megatron's router receives its
// process groups: `sum_over_ranks` sums a tensor over the ranks in place; empty = one process.
// A capacity limit ranks every rank's assignments together (router.cpp): `gather_over_ranks`
// concatenates a tensor's rows over the ranks in rank order (the global micro-batch's order), and
// `rank` is this rank's place in it.
struct LoadReduction {
  std::function<void(at::Tensor&)> sum_over_ranks;
  int64_t world_size = 1;
  std::function<at::Tensor(const at::Tensor&)> gather_over_ranks;
  int64_t rank = 0;
};
// Counts [E] summed over the ranks in a training-mode forward (also the first, gradient-free
// forward of a checkpointed block, so that the aux loss it reports is the one its recompute
// differentiates), local counts otherwise; and the world size they cover.
std::pair<at::Tensor, int64_t> global_load_counts(const at::Tensor& tokens_per_expert,
                                                  bool training, const LoadReduction& reduction);

// Router z-loss (ST-MoE): mean_t (logsumexp_e logits[t, e])^2, logits [T, E] fp32.
at::Tensor router_z_loss(const at::Tensor& logits);

// Expert capacity in assignments: ceil(capacity_factor * T * k / E); <= 0 factor means dropless
// (returns T * k, which no expert can exceed).
int64_t expert_capacity(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                        double capacity_factor);

}  // namespace moe::moe
