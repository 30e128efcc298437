// CPU emulation of the optimizer's kernel (src/kernels/adam8bit.cu: adam8bit_step_kernel), run
// through its GPU test's comparisons (optimizer_checks.h) in CI. The conventions of every
// emulation are in permute_emulation.h.
#pragma once

#include "optimizer_checks.h"

namespace moe::kernel_emulation {

// One "thread block" per 256-value block, one "thread" per value, the kernel's operations in
// its order (the __f*_rn intrinsics as plain IEEE float operations, __fmaf_rn as std::fma).
kernel_checks::Adam8bitOutputs adam8bit_step(const kernel_checks::Adam8bitInputs& in);

}  // namespace moe::kernel_emulation
