#include "moe/layers/profile_scope.h"

#include <torch/cuda.h>

#include <atomic>
#include <mutex>
#include <string>

namespace moe::layers::profile {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_recording{false};
bool g_sync = false;
std::mutex g_mutex;
std::vector<monitor::ModuleTiming> g_timings;
thread_local bool t_forward = false;
thread_local int64_t t_layer = -1;

void sync_device() {
  if (g_sync) torch::cuda::synchronize();
}

}  // namespace

void start(bool sync_cuda) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_timings.clear();
  g_sync = sync_cuda;
  g_recording.store(true);
}

std::vector<monitor::ModuleTiming> stop() {
  g_recording.store(false);
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::move(g_timings);
}

ForwardPhase::ForwardPhase() : previous_(t_forward) { t_forward = true; }
ForwardPhase::~ForwardPhase() { t_forward = previous_; }

Layer::Layer(int64_t index) : previous_(t_layer) { t_layer = index; }
Layer::~Layer() { t_layer = previous_; }

Scope::Scope(const char* kind) : kind_(kind) {
  if (!g_recording.load(std::memory_order_relaxed) || !t_forward) return;
  on_ = true;
  sync_device();
  t0_ = Clock::now();
}

Scope::~Scope() {
  if (!on_) return;
  sync_device();
  const double s = std::chrono::duration<double>(Clock::now() - t0_).count();
  const int64_t layer = t_layer;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& m : g_timings) {
    if (m.name == kind_ && m.layer == layer) {
      m.seconds += s;
      ++m.calls;
      return;
    }
  }
  g_timings.push_back({kind_, layer, s, 1});
}

}  // namespace moe::layers::profile
