// Argument checks of our CUDA kernels that a caller can trip: index values out of range and
// launches past the grid limit. Shapes, dtypes and grid sizes are checked on the host on every
// call (free); index *values* live on the device, so checking them costs a device-to-host copy
// and a sync: they are checked when argument checks are on (debug builds, MOE_KERNEL_ARG_CHECKS=1
// in the environment, or set_argument_checks(true)), and by device-side asserts in debug builds.
// Without checks, the kernels still never write out of bounds: an out-of-range id is skipped.
//
// Plain ATen: the same checks run on CPU tensors (unit-tested without a GPU).
#pragma once

#include <ATen/core/Tensor.h>

namespace moe::kernels {

void set_argument_checks(bool enabled);
bool argument_checks();

// Throws c10::Error naming `what`, the first offending value and its position, and [lo, hi).
void check_values_in_range(const at::Tensor& values, int64_t lo, int64_t hi, const char* what);

// Throws c10::Error when `kernel` would need more than INT32_MAX blocks for `items` items.
void check_grid(int64_t blocks, int64_t items, const char* kernel);

}  // namespace moe::kernels
