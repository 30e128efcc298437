// CPU emulation of the MXFP4 dequantization kernel (src/kernels/dequant_mxfp4.cu), run through
// the GPU test's own comparison (dequant_mxfp4_checks.h) in CI: the kernel's per-thread body
// (moe/kernels/dequant_mxfp4_pack.h) for every thread index, with the launcher's shape.
#pragma once

#include <torch/types.h>

#include "dequant_mxfp4_checks.h"

namespace moe::kernel_emulation {

// Deliberate kernel bugs, for the mutation tests.
enum class DequantMxfp4Fault {
  kNone,
  kLastThreadSkipped,   // the grid one thread short
  kHighNibbleFirst,     // the first value read from the high nibble (bitsandbytes' order)
  kScaleOffByOne,       // 2^(scale - 126): every value doubled
  kScale255Infinite,    // e2m1 x 2^(scale - 127) with 2^128 = inf: 0 x inf = NaN, 0.5 x inf = inf
  kSubnormalScaleZero,  // scale bytes 0 and 1 (fp32 subnormal powers) flushed to 0
  kBlockFromByteIndex,  // the scale of byte / 32, not value / 32
  // (bf16 has no rounding to get wrong: every value is exact in it, or inf past fp32's range.)
  kHalfSubnormalsFlushed,  // fp16: results below 2^-14 written as signed zeros
  kHalfTiesAway,           // fp16: subnormal ties rounded away from zero, not to even
  kHalfSaturated,          // fp16: overflow to +-65504, not to inf
};

// dequant_mxfp4.cu's launch into `out` (from make_mxfp4_output: poisoned, maybe misaligned).
void dequantize_mxfp4(const kernel_checks::Mxfp4Tensors& m, const torch::Tensor& out,
                      DequantMxfp4Fault fault = DequantMxfp4Fault::kNone);

}  // namespace moe::kernel_emulation
