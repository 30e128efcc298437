#include "moe/optim/host_arena.h"

#include <ATen/ATen.h>

#include <map>
#include <new>
#include <stdexcept>
#include <string>

#ifdef MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moe::optim {

at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, bool pinned) {
  const auto options = at::TensorOptions().dtype(dtype);
  if (!pinned || numel == 0) return at::empty({numel}, options);
#ifdef MOE_HAVE_CUDA
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next call
    throw std::bad_alloc();    // reported as a host out-of-memory with the planned figures
  }
  return at::from_blob(
      ptr, {numel}, [](void* p) { cudaFreeHost(p); }, options);
#else
  return at::empty({numel}, options.pinned_memory(true));
#endif
}

size_t HostArena::add(c10::IntArrayRef sizes, at::ScalarType dtype) {
  TORCH_CHECK(!allocated_, "HostArena: add() after allocate()");
  entries_.push_back({sizes.vec(), dtype, 0});
  return entries_.size() - 1;
}

void HostArena::allocate() {
  TORCH_CHECK(!allocated_, "HostArena: allocated twice");
  std::map<at::ScalarType, int64_t> numel;  // per dtype: the elements reserved so far
  for (Entry& e : entries_) {
    int64_t n = 1;
    for (int64_t s : e.sizes) n *= s;
    e.offset = numel[e.dtype];
    numel[e.dtype] += n;
  }
  std::map<at::ScalarType, at::Tensor> buffers;
  for (const auto& [dtype, n] : numel) {
    buffers[dtype] = host_buffer(n, dtype, pinned_);
    bytes_ += n * static_cast<int64_t>(c10::elementSize(dtype));
  }
  views_.reserve(entries_.size());
  for (const Entry& e : entries_) {
    int64_t n = 1;
    for (int64_t s : e.sizes) n *= s;
    views_.push_back(buffers[e.dtype].narrow(0, e.offset, n).view(e.sizes));
  }
  allocated_ = true;
}

}  // namespace moe::optim
