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
ScoreAndSelectOutput score_and_select(const at::Tensor& logits, const at::Tensor& bias,
                                      int64_t top_k, bool sigmoid_scores, bool normalize_topk);

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// poison: fill the outputs with NaN / -1 first, so the tests catch elements never written.
ScoreAndSelectOutput score_and_select_forward(const at::Tensor& logits, const at::Tensor& bias,
                                              int64_t top_k, bool sigmoid_scores,
                                              bool normalize_topk, bool poison = false);
// Any of grad_probs [T, E], grad_weight [T, k], grad_lse [T] may be undefined (no gradient).
at::Tensor score_and_select_backward(const at::Tensor& logits, const at::Tensor& probs,
                                     const at::Tensor& topk_idx, const at::Tensor& topk_weight,
                                     const at::Tensor& lse, const at::Tensor& grad_probs,
                                     const at::Tensor& grad_weight, const at::Tensor& grad_lse,
                                     bool sigmoid_scores, bool normalize_topk);
}  // namespace detail

}  // namespace moe::kernels
