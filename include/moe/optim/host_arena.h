// Host memory for optimizer offload in one allocation per dtype: the fp32 master weights, the
// gradient staging and the host gradients of every parameter as views packed back to back.
//
// Why not one pinned tensor per parameter: PyTorch's caching host allocator (what
// at::empty(..., pinned_memory(true)) uses) rounds every block up to a power of two and keeps a
// freed block for later requests of that size instead of returning it to the system, so
// per-parameter pinned buffers cost between 1x and 2x their bytes (a 3072 x 8192 fp32 matrix, 96
// MiB, takes 128 MiB), and a buffer replaced later stays allocated. One buffer per dtype, taken
// straight from cudaHostAlloc and freed with the last view, costs exactly
// sum(numel) x element size: the figure `moe-train plan` counts (docs/memory.md). Within a dtype
// every view starts at a multiple of its element size; no padding is added.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace moe::optim {

class HostArena {
 public:
  // pinned: page-locked memory (asynchronous copies to and from a GPU); otherwise pageable.
  explicit HostArena(bool pinned = false) : pinned_(pinned) {}
  // Reserves a tensor of `sizes` in `dtype`; returns its index. Only before allocate().
  size_t add(c10::IntArrayRef sizes, at::ScalarType dtype);
  // One buffer per dtype holding every reserved tensor (uninitialised). Once.
  void allocate();
  bool allocated() const { return allocated_; }
  // A view of reserved tensor `i` (after allocate()); it keeps its buffer alive.
  const at::Tensor& operator[](size_t i) const { return views_.at(i); }
  size_t size() const { return entries_.size(); }
  // The bytes the buffers hold: exactly the sum of the reserved tensors' bytes.
  int64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  struct Entry {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
    int64_t offset = 0;  // in elements, within its dtype's buffer
  };
  std::vector<Entry> entries_;
  std::vector<at::Tensor> views_;
  bool pinned_ = false;
  bool allocated_ = false;
  int64_t bytes_ = 0;
};

// One host buffer of `numel` elements of `dtype` (pinned: cudaHostAlloc, outside PyTorch's
// caching host allocator; without CUDA support in the build, that allocator).
at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, bool pinned);

}  // namespace moe::optim
