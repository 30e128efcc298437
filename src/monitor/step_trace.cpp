#include "moe/monitor/step_trace.h"

#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <kineto/ActivityType.h>
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
  constexpr auto kGpuAnnotation =
      static_cast<uint8_t>(libkineto::ActivityType::GPU_USER_ANNOTATION);
  std::vector<TraceEvent> events;
  events.reserve(result.events().size());
  for (const auto& e : result.events()) {
    // Async spans do not nest on their thread; hidden events are the profiler's own; a user
    // scope's GPU shadow (ProfilerStep#N on the device: first to last kernel) is no kernel.
    if (e.isAsync() || e.isHiddenEvent() || e.activityType() == kGpuAnnotation) continue;
    TraceEvent t;
    t.device = e.deviceType() != c10::DeviceType::CPU;
    t.name = e.name();
    if (!t.device && t.name.rfind("ProfilerStep#", 0) == 0) {
      t.step = true;
      t.name = "ProfilerStep (outside operators)";  // one row for every step's host time
    }
    t.thread = t.device ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId();
    t.start_ns = e.startNs();
    t.end_ns = e.endNs();
    events.push_back(std::move(t));
  }
  return events;
}

}  // namespace

StepTrace::StepTrace(int64_t first, int64_t end, std::filesystem::path file, bool cuda)
    : first_(first), end_(end), file_(std::move(file)), cuda_(cuda) {}

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
    // Prepared here, not earlier: a prepared profiler already records (CUPTI) every kernel,
    // into buffers that a late window would find full.
    kineto::prepareProfiler(profiler_config(), activities(cuda_));
    kineto::enableProfiler(profiler_config(), activities(cuda_));
    running_ = true;
  }
  step_scope_ = std::make_unique<StepScope>(step);
}

bool StepTrace::end_step(int64_t step) {
  if (!running_ || !step_scope_) return false;
  step_scope_.reset();
  return step + 1 >= end_;
}

std::optional<std::string> StepTrace::finish() {
  if (!running_) return std::nullopt;
  step_scope_.reset();
  running_ = false;
  auto result = kineto::disableProfiler();
  std::string table = format_trace_summary(summarize_trace(trace_events(*result)), /*top=*/15);
  try {  // a trace that cannot be written is no reason to stop the training
    std::filesystem::create_directories(file_.parent_path());
    result->save(file_.string());
    table += "trace: written to " + file_.string();
  } catch (const std::exception& e) {
    table += "trace: not written to " + file_.string() + ": " + e.what();
  }
  return table;
}

}  // namespace moe::monitor
