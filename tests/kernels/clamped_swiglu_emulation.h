// CPU emulation of gpt-oss's clamped SwiGLU kernel (src/kernels/clamped_swiglu.cu), run through
// the GPU tests' own comparisons (clamped_swiglu_checks.h) in CI: the kernel's per-thread bodies
// (moe/kernels/clamped_swiglu_pack.h) for every thread index, with the launcher's shape, pack
// width and scalars.
#pragma once

#include <torch/types.h>

#include "clamped_swiglu_checks.h"

namespace moe::kernel_emulation {

// Deliberate kernel bugs, for the mutation tests. The first two run the kernel's own bodies
// (a shorter grid, swapped operands); the others a mutant of the per-element arithmetic
// (clamped_swiglu_emulation.cpp) that, without its fault (kMutantBaseline), matches the kernel's
// bodies bit for bit, so each failure is its fault's.
enum class ClampedSwigluFault {
  kNone,
  kLastPackSkipped,        // the grid one thread short
  kOperandsSwapped,        // gate and up exchanged
  kMutantBaseline,         // the mutant without a fault (equals kNone)
  kGateClampedBelow,       // the wrong clamp side: g = max(gate, -limit), not min(gate, limit)
  kUpUnclamped,            // u = up, the clamp forgotten
  kPlusOneDropped,         // h = u * glu, not (u + 1) * glu
  kAlphaDropped,           // sigmoid(g), not sigmoid(alpha g)
  kGradientPassesOutside,  // both gradients pass where the clamp stops them
  kBoundsExcluded,         // the gradients stop at the bounds too (strict inequalities)
};

// clamped_swiglu.cu forward and backward kernels over `in` (outputs poisoned with NaN first).
kernel_checks::ClampedSwigluOutputs clamped_swiglu_all(
    const kernel_checks::ClampedSwigluInputs& in,
    ClampedSwigluFault fault = ClampedSwigluFault::kNone);

}  // namespace moe::kernel_emulation
