// Pure MoE math on plain values: no config, no modules. Shapes and formulas documented here
// are the contract the CUDA kernels are tested against.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace moe::moe {

// Switch/GShard load-balancing loss.
//   probs:             [T, E] fp32 router probabilities (softmax, or normalised sigmoid scores)
//   tokens_per_expert: [E] int64 assignments per expert (over all k slots)
//   aux = E * sum_e f_e * P_e,  f_e = tokens_per_expert[e] / (T * k),  P_e = mean_t probs[t, e]
// Minimised (= 1) by a uniform load. Gradient flows through P only, as in Switch.
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                               int64_t top_k);

// Router z-loss (ST-MoE): mean_t (logsumexp_e logits[t, e])^2, logits [T, E] fp32.
at::Tensor router_z_loss(const at::Tensor& logits);

// Expert capacity in assignments: ceil(capacity_factor * T * k / E); <= 0 factor means dropless
// (returns T * k, which no expert can exceed).
int64_t expert_capacity(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                        double capacity_factor);

}  // namespace moe::moe
