// CPU emulation of the router family's kernels (src/kernels/router.cu: score_and_select), run
// through the GPU tests' own comparisons (router_checks.h) in CI. The conventions of every
// emulation are in permute_emulation.h; transcendentals use the host's expf/logf, not CUDA's.
#pragma once

#include <torch/types.h>

#include <utility>

#include "router_checks.h"

namespace moe::kernel_emulation {

// Deliberate faults of the selection, for the mutation tests: each must fail the checks.
struct RouterMutation {
  bool expert_ties_to_higher_id = false;  // equal keys: the higher expert id wins
  bool group_ties_to_higher_id = false;   // equal group keys: the higher group id wins
  bool group_key_best_only = false;       // a group's key: its best key, whatever the count
  bool group_key_best_twice = false;      // the second round does not exclude the first winner
  bool nan_group_keys_last = false;       // a NaN group key ranks lowest (at::sort: highest)
};

// router_forward_kernel's selection from given scores probs [T, E] (fp32, CPU): the keys
// (+ in.bias, NaN -> -inf), keep_best_groups with its lane layout and warp arg-max trees when
// in.n_group > 1, the k rounds, the weights. Returns topk_idx [T, k] int64, topk_weight [T, k].
std::pair<torch::Tensor, torch::Tensor> select_experts(
    const torch::Tensor& probs, const kernel_checks::ScoreAndSelectInputs& in,
    const RouterMutation& mutation = {});

// router.cu router_forward_kernel and router_backward_kernel (outputs incl. grad_logits): one
// token per "warp", lane l holding experts l, l + 32, ..., the warp-shuffle reduction trees.
kernel_checks::ScoreAndSelectOutputs score_and_select(const kernel_checks::ScoreAndSelectInputs& in,
                                                      const RouterMutation& mutation = {});

}  // namespace moe::kernel_emulation
