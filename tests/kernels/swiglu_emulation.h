// CPU emulation of the SwiGLU family's kernels (src/kernels/swiglu.cu), run through the GPU
// tests' own comparisons (swiglu_checks.h) in CI: the kernels' per-thread bodies
// (moe/kernels/swiglu_pack.h) for every thread index, with the launcher's shape and pack width.
#pragma once

#include <torch/types.h>

#include "swiglu_checks.h"

namespace moe::kernel_emulation {

// Deliberate kernel bugs, for the mutation tests.
enum class SwigluFault {
  kNone,
  kLastPackSkipped,        // the grid one thread short
  kOperandsSwapped,        // silu(up) * gate (gelu(up) * gate)
  kDerivativePartDropped,  // d silu taken as sigmoid(gate) (the gate (1 - sig) term dropped);
                           // d gelu as 0.5 (1 + tanh(inner)) (the tanh derivative's term dropped)
  kRowStrideIgnored,       // packed: gate and up read as if rows were cols long, not 2 cols
};

// swiglu.cu forward and backward kernels over `in` with its gate (outputs poisoned with NaN
// first).
kernel_checks::SwigluOutputs swiglu_all(const kernel_checks::SwigluInputs& in,
                                        SwigluFault fault = SwigluFault::kNone);

}  // namespace moe::kernel_emulation
