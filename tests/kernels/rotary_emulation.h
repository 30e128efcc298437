// CPU emulation of the rotary family's kernel (src/kernels/rotary.cu rotary_kernel), run through
// the GPU tests' own comparisons (rotary_checks.h) in CI: the kernel's per-thread body
// (moe/kernels/rotary_pack.h) for every thread index, with the launcher's shape and pack width.
#pragma once

#include <torch/types.h>

#include "rotary_checks.h"

namespace moe::kernel_emulation {

// Deliberate kernel bugs, for the mutation tests.
enum class RotaryFault {
  kNone,
  kFusedMultiplyAdd,  // x c + y s rounded once (what nvcc's contraction would make of it)
  kLastPackSkipped,   // the grid one thread short
};

// rotary.cu rotary_kernel: forward (backward = false) or the gradient of x from `x` = the
// output gradient.
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool backward, RotaryFault fault = RotaryFault::kNone);
kernel_checks::RotaryOutputs rotary_all(const kernel_checks::RotaryInputs& in,
                                        RotaryFault fault = RotaryFault::kNone);

}  // namespace moe::kernel_emulation
