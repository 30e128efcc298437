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

// Gives the C heap's free pages back to the system (glibc's malloc_trim; a no-op elsewhere).
// glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so
// after a few frees the 4 MiB matrices of a 4-bit load come from the heap, and the holes that
// the long-lived 4-bit codes leave between them stay resident: called after each block is
// quantized and each 4-bit parameter is loaded (tests/hf/qlora_memory_test.py).
void return_free_host_memory();

}  // namespace moe
