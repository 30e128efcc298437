// Device-side helpers shared by the kernel families' .cu files (permute.cu, router.cu): the
// debug-build argument asserts.
#pragma once

#include <c10/macros/Macros.h>

// Device-side argument asserts in debug builds; release kernels skip an out-of-range index
// instead of touching memory outside their tensors (see moe/kernels/kernel_args.h).
#ifndef NDEBUG
#define MOE_DEVICE_ASSERT(cond) CUDA_KERNEL_ASSERT(cond)
#else
#define MOE_DEVICE_ASSERT(cond) ((void)0)
#endif
