// CPU emulation of the router family's kernels (src/kernels/router.cu: score_and_select), run
// through the GPU tests' own comparisons (router_checks.h) in CI. The conventions of every
// emulation are in permute_emulation.h; transcendentals use the host's expf/logf, not CUDA's.
#pragma once

#include <torch/types.h>

#include "router_checks.h"

namespace moe::kernel_emulation {

// router.cu router_forward_kernel and router_backward_kernel (outputs incl. grad_logits): one
// token per "warp", lane l holding experts l, l + 32, ..., the warp-shuffle reduction trees.
kernel_checks::ScoreAndSelectOutputs score_and_select(
    const kernel_checks::ScoreAndSelectInputs& in);

}  // namespace moe::kernel_emulation
