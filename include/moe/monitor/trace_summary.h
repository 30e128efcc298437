// What a profiled window of steps spent its time on: the trace's events (host operators and
// device kernels, as the torch profiler records them) folded into tables by name and by kind of
// kernel, with how busy the device was. No LibTorch: monitor/step_trace.h hands the events over.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe::monitor {

struct TraceEvent {
  std::string name;
  bool device = false;  // a kernel, copy or fill on the GPU; otherwise a host operator
  uint64_t thread = 0;  // host thread (nesting is per thread); the stream for device events
  uint64_t start_ns = 0, end_ns = 0;
  bool step = false;  // a training step's host span (ProfilerStep#N); the step ends synchronised
};

struct TraceRow {
  std::string name;
  int64_t calls = 0;
  double ms = 0;  // self time: a host operator's time minus the operators it called
};

struct TraceSummary {
  std::vector<TraceRow> device_kernels;  // by name, longest first
  std::vector<TraceRow> device_kinds;    // by kernel_kind(), longest first
  std::vector<TraceRow> host_ops;        // by name, self time, longest first
  double device_busy_ms = 0;             // the union of the device intervals (streams overlap)
  int64_t steps = 0;                     // step spans
  double wall_ms = 0;                    // their total duration
};

// A kernel's kind from its name: "attention", "optimizer", "moe kernels" (ours), "gemm", "nccl",
// "copy", "norm", "loss", "reduce", "elementwise" or "other" (docs/monitoring.md).
std::string kernel_kind(std::string_view name);

// With step spans among the events, only what starts inside a step counts (validation and
// checkpoints between the window's steps are in the trace, but are no step's time), and the
// wall time is the spans' total; without any, every event counts and the wall time is 0.
TraceSummary summarize_trace(std::vector<TraceEvent> events);

// The log's table: the device's busy share of the steps' wall time, the kinds, the `top`
// longest kernels; without device events, the `top` host operators by self time.
std::string format_trace_summary(const TraceSummary& s, size_t top);

}  // namespace moe::monitor
