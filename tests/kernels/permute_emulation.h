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
// Deliberate kernel bugs, for the mutation tests: the emulation runs the kernels' own bodies, so
// a fault here is the bug a kernel edit could make.
enum class EmulatedFault {
  kNone,
  kLastAssignmentSkipped,  // launched with k - 1 (a wrong K template argument)
  kHalfTheLanes,           // half of each token's threads launched; the stride assumes all
  kShortReduction,         // the combine backward's butterfly one level short
};

// permute.cu scatter_rows_kernel (x read once per token, written to each kept row)
torch::Tensor permute_forward(const torch::Tensor& x, const torch::Tensor& rows, int64_t k,
                              int64_t num_rows, EmulatedFault fault = EmulatedFault::kNone);
// permute.cu sum_rows_kernel without weights
torch::Tensor permute_backward(const torch::Tensor& grad_out, const torch::Tensor& rows, int64_t k,
                               EmulatedFault fault = EmulatedFault::kNone);
// permute.cu sum_rows_kernel with weights
torch::Tensor combine_forward(const torch::Tensor& y, const torch::Tensor& rows,
                              const torch::Tensor& weights,
                              EmulatedFault fault = EmulatedFault::kNone);
// permute.cu combine_backward_kernel: {grad_y, grad_w}
std::pair<torch::Tensor, torch::Tensor> combine_backward(
    const torch::Tensor& grad_out, const torch::Tensor& y, const torch::Tensor& rows,
    const torch::Tensor& weights, EmulatedFault fault = EmulatedFault::kNone);
// All six for one set of inputs, as the GPU test runs the kernels.
kernel_checks::PermuteOutputs permute_all(const kernel_checks::PermuteInputs& in,
                                          EmulatedFault fault = EmulatedFault::kNone);

}  // namespace moe::kernel_emulation
