// CPU emulations of the permute family's kernels (src/kernels/permute.cu: dispatch_plan,
// permute, combine), run through the GPU tests' own comparisons (permute_checks.h) in CI.
//
// Like every emulation here (router_emulation.h, experts_emulation.h): the same order of
// operations, the same rounding points (fp32 registers, fma where nvcc contracts a * b + c, one
// rounding to the output dtype), the same tie and out-of-range rules. They show the tolerances
// admit the kernels' arithmetic; they do not predict their last bit. Each function names the
// kernel it emulates. CPU tensors in and out.
#pragma once

#include <torch/types.h>

#include <array>
#include <utility>

#include "permute_checks.h"

namespace moe::kernel_emulation {

// permute.cu invert_assignment_kernel
torch::Tensor assignment_rows(const torch::Tensor& source_assignment, int64_t num_assignments);
// permute.cu plan_tiles_kernel<false>, the integer scan, plan_tiles_kernel<true>
std::array<torch::Tensor, 3> dispatch_plan(const torch::Tensor& topk_idx, int64_t num_experts);
// permute.cu gather_rows_kernel
torch::Tensor permute_forward(const torch::Tensor& x, const torch::Tensor& source_token);
// permute.cu permute_backward_kernel
torch::Tensor permute_backward(const torch::Tensor& grad_out, const torch::Tensor& rows, int64_t k);
// permute.cu combine_forward_kernel
torch::Tensor combine_forward(const torch::Tensor& y, const torch::Tensor& rows,
                              const torch::Tensor& weights);
// permute.cu combine_backward_kernel: {grad_y, grad_w}
std::pair<torch::Tensor, torch::Tensor> combine_backward(const torch::Tensor& grad_out,
                                                         const torch::Tensor& y,
                                                         const torch::Tensor& source_token,
                                                         const torch::Tensor& source_assignment,
                                                         const torch::Tensor& weights);
// All six for one set of inputs, as the GPU test runs the kernels.
kernel_checks::PermuteOutputs permute_all(const kernel_checks::PermuteInputs& in);

}  // namespace moe::kernel_emulation
