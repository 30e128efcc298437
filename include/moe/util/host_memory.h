// Bytes of live CPU tensors, counted by a wrapper around LibTorch's CPU allocator: the CPU
// counterpart of torch.cuda.max_memory_allocated, used to check the memory planner
// (`moe-train plan`) against a real run. Off unless installed (MOE_HOST_MEMORY_REPORT=1 makes
// main() install it first thing and print the figures at exit).
#pragma once

#include <cstdint>

namespace moe {

void install_host_tensor_counter();  // idempotent; call before tensors are allocated
int64_t host_tensor_bytes();         // live now
int64_t host_tensor_peak_bytes();    // the most live at any time since install

}  // namespace moe
