// training.profile_step_start / profile_step_end (Megatron's --profile-step-start/end): the torch
// profiler (Kineto: host operators, and CUDA kernels through CUPTI) over a window of steps, saved
// as a Chrome trace (Perfetto, chrome://tracing, TensorBoard's profiler plugin) and folded into a
// table for the log (monitor/trace_summary.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace moe::monitor {

class StepTrace {
 public:
  // Steps [first, end), 1-based; `file` is the trace to write.
  StepTrace(int64_t first, int64_t end, std::filesystem::path file, bool cuda);
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;
  ~StepTrace();

  // Before step `step` (1-based): the window's first step starts the profiler.
  void before_step(int64_t step);
  // After step `step` has finished on the device: true when it was the window's last step.
  bool end_step(int64_t step);
  // Stops the profiler, writes the trace and returns the summary table, its last line saying
  // where the trace went (or why it could not be written); none when not running.
  std::optional<std::string> finish();

 private:
  struct StepScope;
  int64_t first_, end_;
  std::filesystem::path file_;
  bool cuda_;
  bool running_ = false;
  std::unique_ptr<StepScope> step_scope_;  // the trace's ProfilerStep#N span
};

}  // namespace moe::monitor
