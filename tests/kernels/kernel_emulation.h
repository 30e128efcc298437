// CPU emulations of our CUDA kernels' numerics: the same order of operations, the same rounding
// points (fp32 registers, fma where nvcc contracts a * b + c, one rounding to the output dtype),
// the same tie and NaN rules, the same warp-shuffle reduction trees. They stand in for the
// kernels in CI (no GPU), where they are run through the GPU tests' own comparisons
// (kernel_checks.h). Transcendentals use the host's expf/logf, not CUDA's: the emulation shows the
// tolerances admit the kernels' arithmetic, it does not predict their last bit.
//
// Each function names the kernel it emulates (src/kernels/*.cu). CPU tensors in and out.
#pragma once

#include <torch/types.h>

#include <array>
#include <utility>

#include "kernel_checks.h"

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

// router.cu router_forward_kernel and router_backward_kernel (outputs incl. grad_logits).
kernel_checks::RouterOutputs router(const kernel_checks::RouterInputs& in);

// at::_grouped_mm on bf16 operands as cuBLAS-class kernels compute it: fp32 accumulation (here
// MKL's fp32 GEMM, another summation order), one rounding to bf16; and its two gradients.
kernel_checks::GroupedGemmOutputs grouped_gemm(const kernel_checks::GroupedGemmInputs& in);
// The bf16 experts path (experts.cpp, grouped GEMMs under bf16): fp32 arithmetic, bf16 rounding
// where that path rounds; gradients by autograd through the same graph.
kernel_checks::ExpertsOutputs experts(const kernel_checks::ExpertsInputs& in);

}  // namespace moe::kernel_emulation
