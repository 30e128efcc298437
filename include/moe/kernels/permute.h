// The permute family of our CUDA kernels (src/kernels/permute.cu, permute_ops.cpp): dispatch_plan,
// permute and combine as autograd-aware tensor ops, and their raw launches (detail::). The ATen
// references of the same names and contracts are in moe/moe/dispatcher.h; tests compare the two.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>

namespace moe::kernels {

// True when this binary was built with nvcc and carries the kernels.
bool cuda_kernels_compiled();

// out[r] = x[source_token[r]]. x [T, d] CUDA; source_token, source_assignment [N] int64 (the
// plan of moe/moe/dispatcher.h); top_k routes per token. Differentiable in x.
at::Tensor permute(const at::Tensor& x, const at::Tensor& source_token,
                   const at::Tensor& source_assignment, int64_t top_k);

// out[t] = sum_j weights[t, j] * y[row(t * k + j)], fp32 accumulation, out in y's dtype.
// row() inverts source_assignment; dropped assignments contribute nothing.
// Differentiable in y and weights.
at::Tensor combine(const at::Tensor& y, const at::Tensor& source_token,
                   const at::Tensor& source_assignment, const at::Tensor& weights,
                   int64_t num_tokens);

// The dropless dispatch plan (every assignment kept) of topk_idx [T, k] int64 CUDA:
// {source_token, source_assignment, tokens_per_expert}, equal to moe::dispatch_plan's (stable
// rows), from counts -> prefix sum -> rows without sorting and without host syncs.
std::array<at::Tensor, 3> dispatch_plan(const at::Tensor& topk_idx, int64_t num_experts);

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// poison: fill the outputs with NaN / -1 before the launch, so tests see every element a
// kernel leaves unwritten. Index values are range-checked when argument checks are on
// (moe/kernels/kernel_args.h).
//
// The dropless dispatch plan (every assignment kept): {source_token, source_assignment,
// tokens_per_expert}, equal to moe::dispatch_plan's, from counts -> prefix sum -> stable rows
// without sorting and without host syncs.
std::array<at::Tensor, 3> dispatch_plan(const at::Tensor& topk_idx, int64_t num_experts,
                                        bool poison = false);
at::Tensor assignment_rows(const at::Tensor& source_assignment, int64_t num_assignments);
// rows_of_assignment [T*k]: the destination row of each assignment (-1 = dropped), the inverse
// of source_assignment (assignment_rows); num_rows = N.
at::Tensor permute_forward(const at::Tensor& x, const at::Tensor& rows_of_assignment, int64_t top_k,
                           int64_t num_rows, bool poison = false);
at::Tensor permute_backward(const at::Tensor& grad_out, const at::Tensor& rows_of_assignment,
                            int64_t top_k, bool poison = false);
at::Tensor combine_forward(const at::Tensor& y, const at::Tensor& rows_of_assignment,
                           const at::Tensor& weights, bool poison = false);
// Returns {grad_y [N, d], grad_weights [T, k] fp32}.
std::pair<at::Tensor, at::Tensor> combine_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                                   const at::Tensor& rows_of_assignment,
                                                   const at::Tensor& weights, bool poison = false);
}  // namespace detail

}  // namespace moe::kernels
