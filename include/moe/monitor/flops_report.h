// The flops profiler's table (DeepSpeed's flops_profiler block): per module kind, its
// parameters, forward + backward FLOPs in the profiled step (config::module_costs x tokens), the
// measured forward latency and its share of the step; the slowest modules; per-layer rows.
// No LibTorch: the latencies are measured by moe/layers/profile_scope.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"

namespace moe::monitor {

struct ModuleTiming {
  std::string name;    // a config::ModuleCost name, or "optimizer"
  int64_t layer = -1;  // -1: not a per-layer module
  double seconds = 0;  // forward latency in the profiled step (all micro-batches)
  int64_t calls = 0;
};

struct StepTimes {
  int64_t step = 0;
  double step_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
};

// The table as text, one row per line.
std::string flops_report(const config::Config& cfg, const StepTimes& t,
                         const std::vector<ModuleTiming>& timings);

}  // namespace moe::monitor
