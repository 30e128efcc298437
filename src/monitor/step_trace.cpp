#include "moe/monitor/step_trace.h"

#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "moe/monitor/trace_summary.h"

namespace moe::monitor {

namespace kineto = torch::autograd::profiler;
namespace pimpl = torch::profiler::impl;

// The step's span in the trace, named as torch.profiler's schedule names it ("ProfilerStep#N"),
// so the trace viewers show step boundaries. The name outlives the record (it holds a view).
struct StepTrace::StepScope {
  explicit StepScope(int64_t step) : name("ProfilerStep#" + std::to_string(step)) {
    record.before(std::string_view(name), c10::ArrayRef<const c10::IValue>{});
  }
  std::string name;
  at::RecordFunction record{at::RecordScope::USER_SCOPE};
};

namespace {

std::set<pimpl::ActivityType> activities(bool cuda) {
  std::set<pimpl::ActivityType> a{pimpl::ActivityType::CPU};
  if (cuda) a.insert(pimpl::ActivityType::CUDA);
  return a;
}

pimpl::ProfilerConfig profiler_config() {
  return pimpl::ProfilerConfig(pimpl::ProfilerState::KINETO);
}

std::vector<TraceEvent> trace_events(const kineto::ProfilerResult& result) {
  std::vector<TraceEvent> events;
  events.reserve(result.events().size());
  for (const auto& e : result.events()) {
    if (e.isAsync()) continue;  // spans that do not nest on their thread
    TraceEvent t;
    t.device = e.deviceType() != c10::DeviceType::CPU;
    t.name = e.name();
    // One row for every step's host time outside any operator, not one per step.
    if (t.name.rfind("ProfilerStep#", 0) == 0) t.name = "ProfilerStep (outside operators)";
    t.thread = t.device ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId();
    t.start_ns = e.startNs();
    t.end_ns = e.endNs();
    events.push_back(std::move(t));
  }
  return events;
}

}  // namespace

StepTrace::StepTrace(int64_t first, int64_t end, std::filesystem::path file, bool cuda)
    : first_(first), end_(end), file_(std::move(file)), cuda_(cuda) {
  if (first_ > 0) kineto::prepareProfiler(profiler_config(), activities(cuda_));
}

StepTrace::~StepTrace() {
  if (!running_) return;
  step_scope_.reset();
  try {
    kineto::disableProfiler();
  } catch (...) {  // a destructor on an error path: the trace is lost, the error is what matters
  }
}

void StepTrace::before_step(int64_t step) {
  if (step < first_ || step >= end_) return;
  if (!running_) {
    kineto::enableProfiler(profiler_config(), activities(cuda_));
    running_ = true;
    started_ = std::chrono::steady_clock::now();
  }
  step_scope_ = std::make_unique<StepScope>(step);
}

bool StepTrace::end_step(int64_t step) {
  if (!running_ || !step_scope_) return false;
  step_scope_.reset();
  ++traced_steps_;
  return step + 1 >= end_;
}

std::optional<std::string> StepTrace::finish() {
  if (!running_) return std::nullopt;
  step_scope_.reset();
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_)
          .count();
  running_ = false;
  auto result = kineto::disableProfiler();
  std::filesystem::create_directories(file_.parent_path());
  result->save(file_.string());
  return format_trace_summary(summarize_trace(trace_events(*result)), wall_ms, traced_steps_,
                              /*top=*/15);
}

}  // namespace moe::monitor
