#include "moe/util/host_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>

namespace moe {

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<bool> g_installed{false};

struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void release(void* ctx) {
  auto* c = static_cast<Counted*>(ctx);
  g_live.fetch_sub(c->bytes, std::memory_order_relaxed);
  delete c;  // frees the inner allocation through its own deleter
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    const auto bytes = static_cast<int64_t>(n);
    const int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return {data, new Counted{std::move(inner), bytes}, &release, device};
  }
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

}  // namespace moe
