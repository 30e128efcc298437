// The router family's CUDA kernel, score_and_select (src/kernels/router.cu, router_ops.cpp): an
// autograd-aware op and its raw launches (detail::). The ATen reference of the same name and
// contract is moe::score_and_select (moe/moe/router.h); the GPU tests compare the two.
//
// fp32 logits [T, E] -> scores -> top-k experts and gate weights -> per-expert counts and the
// per-token logsumexp (z-loss), one warp per token, one pass.
#pragma once

#include <ATen/core/Tensor.h>

namespace moe::kernels {

struct ScoreAndSelectOutput {
  at::Tensor probs;              // [T, E] fp32 softmax or sigmoid scores (differentiable)
  at::Tensor topk_idx;           // [T, k] int64, ties -> lower expert id
  at::Tensor topk_weight;        // [T, k] fp32 (differentiable)
  at::Tensor lse;                // [T] fp32 logsumexp of the logits (differentiable)
  at::Tensor tokens_per_expert;  // [E] int64
};

// bias: undefined, or [E] fp32 added to the scores for selection only (aux-loss-free balancing).
// E <= 256, 1 <= k <= min(E, 8).
// Group-limited selection (DeepSeek-V3, DeepSeek-V2's group_limited_greedy), as the reference
// moe::score_and_select: with n_group > 1 the experts form n_group equal groups of consecutive
// ids, a group's key is the sum of its group_score_experts (1 or 2) highest keys, the topk_group
// best groups are kept (ties -> lower group id) and the k experts chosen among them (the other
// experts' keys count as -inf). n_group <= 32, E % n_group == 0, 1 <= topk_group <= n_group,
// group_score_experts <= E / n_group; the group arguments are ignored when n_group == 1.
ScoreAndSelectOutput score_and_select(const at::Tensor& logits, const at::Tensor& bias,
                                      int64_t top_k, bool sigmoid_scores, bool normalize_topk,
                                      int64_t n_group = 1, int64_t topk_group = 1,
                                      int64_t group_score_experts = 2);

// What the fused router kernel covers: up to kRouterKernelMaxExperts experts (32 lanes x 8
// registers) and top-k up to kRouterKernelMaxTopK; larger routers (Qwen3-Next's and
// Qwen3.5-397B's 512 experts, top-10) take the ATen form.
inline constexpr int64_t kRouterKernelMaxExperts = 256;
inline constexpr int64_t kRouterKernelMaxTopK = 8;

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// poison: fill the outputs with NaN / -1 first, so the tests catch elements never written.
// The group arguments (as in score_and_select) follow it: existing calls pass poison sixth.
ScoreAndSelectOutput score_and_select_forward(const at::Tensor& logits, const at::Tensor& bias,
                                              int64_t top_k, bool sigmoid_scores,
                                              bool normalize_topk, bool poison = false,
                                              int64_t n_group = 1, int64_t topk_group = 1,
                                              int64_t group_score_experts = 2);
// Any of grad_probs [T, E], grad_weight [T, k], grad_lse [T] may be undefined (no gradient).
at::Tensor score_and_select_backward(const at::Tensor& logits, const at::Tensor& probs,
                                     const at::Tensor& topk_idx, const at::Tensor& topk_weight,
                                     const at::Tensor& lse, const at::Tensor& grad_probs,
                                     const at::Tensor& grad_weight, const at::Tensor& grad_lse,
                                     bool sigmoid_scores, bool normalize_topk);
}  // namespace detail

}  // namespace moe::kernels
