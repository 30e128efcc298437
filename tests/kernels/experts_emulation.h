// CPU emulation of the experts family (the bf16 grouped GEMM, at::_grouped_mm, and the experts
// module of src/moe/experts.cpp), run through experts_checks.h in CI.
#pragma once

#include <torch/types.h>

#include "experts_checks.h"

namespace moe::kernel_emulation {

// at::_grouped_mm on bf16 operands as cuBLAS-class kernels compute it: fp32 accumulation (here
// MKL's fp32 GEMM, another summation order), one rounding to bf16; and its two gradients.
kernel_checks::GroupedGemmOutputs grouped_gemm(const kernel_checks::GroupedGemmInputs& in);
// The bf16 experts path (experts.cpp, grouped GEMMs under bf16): fp32 arithmetic, bf16 rounding
// where that path rounds; gradients by autograd through the same graph.
kernel_checks::ExpertsOutputs experts(const kernel_checks::ExpertsInputs& in);

}  // namespace moe::kernel_emulation
