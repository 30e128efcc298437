// CPU emulation of the 4-bit dequantization kernel (src/kernels/dequant_4bit.cu), run through the
// GPU test's own comparison (dequant_4bit_checks.h) in CI: the kernel's per-thread body
// (moe/kernels/dequant_4bit_pack.h) for every thread index, with the launcher's shape.
#pragma once

#include <torch/types.h>

#include "dequant_4bit_checks.h"

namespace moe::kernel_emulation {

// Deliberate kernel bugs, for the mutation tests.
enum class Dequant4bitFault {
  kNone,
  kLastThreadSkipped,   // the grid one thread short
  kNibblesSwapped,      // the first value read from the low nibble
  kAbsmaxFma,           // double quant: dyn * nested + offset in one fma (one rounding)
  kNestedIndexWrong,    // double quant: nested absmax of b / 64 (the 4-bit blocksize), not b / 256
  kBlockFromByteIndex,  // absmax of byte / blocksize, not value / blocksize
  kBf16Truncated,       // the cast to bf16 by truncation, not to nearest even
};

// dequant_4bit.cu's launch into `out` (from make_dequant_output: poisoned, maybe misaligned).
void dequantize_4bit(const quant::Quantized4bit& q, const torch::Tensor& out,
                     Dequant4bitFault fault = Dequant4bitFault::kNone);

}  // namespace moe::kernel_emulation
