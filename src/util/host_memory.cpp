#include "moe/util/host_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <mutex>
#include <unordered_map>

namespace moe {

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<bool> g_installed{false};

// Each counted allocation: the base allocator's DataPtr and its size, by data pointer. The
// DataPtr we hand out keeps the data pointer as its context (a "simple" DataPtr): LibTorch's
// Allocator::raw_allocate asserts that (oneDNN's scratch buffers on CPUs without AVX512-BF16 go
// through it), and raw_deallocate then needs raw_deleter().
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};
std::mutex g_mutex;
std::unordered_map<void*, Counted>& allocations() {
  static auto* m = new std::unordered_map<void*, Counted>();  // outlives static destructors
  return *m;
}

void release(void* data) {
  c10::DataPtr inner;  // freed through its own deleter after the lock is dropped
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = allocations().find(data);
    if (it == allocations().end()) return;
    g_live.fetch_sub(it->second.bytes, std::memory_order_relaxed);
    inner = std::move(it->second.inner);
    allocations().erase(it);
  }
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    const c10::Device device = inner.device();
    const auto bytes = static_cast<int64_t>(n);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      allocations().emplace(data, Counted{std::move(inner), bytes});
    }
    const int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

void install_host_tensor_counter() {
  if (g_installed.exchange(true)) return;
  static CountingAllocator counting(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/1);
}

int64_t host_tensor_bytes() { return g_live.load(); }
int64_t host_tensor_peak_bytes() { return g_peak.load(); }

void return_free_host_memory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace moe
