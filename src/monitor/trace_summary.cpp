#include "moe/monitor/trace_summary.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace moe::monitor {

namespace {

bool has_any(std::string_view name, std::initializer_list<std::string_view> words) {
  return std::any_of(words.begin(), words.end(),
                     [&](std::string_view w) { return name.find(w) != std::string_view::npos; });
}

double ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

std::vector<TraceRow> sorted_rows(const std::map<std::string, TraceRow>& by_name) {
  std::vector<TraceRow> rows;
  rows.reserve(by_name.size());
  for (const auto& [name, row] : by_name) rows.push_back(row);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const TraceRow& a, const TraceRow& b) { return a.ms > b.ms; });
  return rows;
}

void add(std::map<std::string, TraceRow>& by_name, const std::string& name, double t) {
  auto& row = by_name[name];
  row.name = name;
  ++row.calls;
  row.ms += t;
}

// Host operators nest on their thread (aten::linear calls aten::matmul calls aten::mm): each
// event's self time is its duration minus its direct children's.
std::vector<double> self_times(const std::vector<const TraceEvent*>& thread_events) {
  std::vector<double> self(thread_events.size());
  std::vector<size_t> open;  // indices of the events enclosing the current one
  for (size_t i = 0; i < thread_events.size(); ++i) {
    const TraceEvent& e = *thread_events[i];
    self[i] = ms(e.end_ns - e.start_ns);
    while (!open.empty() && thread_events[open.back()]->end_ns <= e.start_ns) open.pop_back();
    if (!open.empty() && e.end_ns <= thread_events[open.back()]->end_ns) {
      self[open.back()] -= self[i];
    }
    open.push_back(i);
  }
  return self;
}

std::string shown_name(const std::string& name) {
  std::string s = name.rfind("void ", 0) == 0 ? name.substr(5) : name;
  return s.size() > 100 ? s.substr(0, 97) + "..." : s;
}

}  // namespace

std::string kernel_kind(std::string_view raw) {
  std::string lower(raw);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string_view n = lower;
  // Order matters: the efficient-attention kernels are CUTLASS kernels, our AdamW is ours.
  if (has_any(n, {"flash", "fmha", "sdpa", "attention", "attn"})) return "attention";
  if (has_any(n, {"adam", "multi_tensor"})) return "optimizer";
  if (has_any(n, {"moe::kernels"})) return "moe kernels";
  if (has_any(n, {"gemm", "cutlass", "xmma", "nvjet", "cublas", "grouped_mm", "splitk"})) {
    return "gemm";
  }
  if (has_any(n, {"nccl"})) return "nccl";
  if (has_any(n, {"memcpy", "memset"})) return "copy";
  if (has_any(n, {"norm"})) return "norm";
  if (has_any(n, {"softmax", "nll_loss", "cross_entropy"})) return "loss";
  if (has_any(n, {"reduce"})) return "reduce";
  if (has_any(n, {"elementwise", "vectorized", "unrolled", "cat", "copy", "index", "scatter",
                  "gather", "fill"})) {
    return "elementwise";
  }
  return "other";
}

TraceSummary summarize_trace(std::vector<TraceEvent> events) {
  std::sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns > b.end_ns;
  });
  TraceSummary s;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // sorted by start, as the events
  for (const TraceEvent& e : events) {
    if (e.step && e.end_ns >= e.start_ns) {
      spans.emplace_back(e.start_ns, e.end_ns);
      s.wall_ms += ms(e.end_ns - e.start_ns);
    }
  }
  s.steps = static_cast<int64_t>(spans.size());
  auto in_a_step = [&](uint64_t t) {
    auto after = std::upper_bound(spans.begin(), spans.end(), std::make_pair(t, UINT64_MAX));
    return after != spans.begin() && t <= std::prev(after)->second;
  };
  std::map<std::string, TraceRow> kernels, kinds, host;
  std::map<uint64_t, std::vector<const TraceEvent*>> by_thread;
  uint64_t busy_until = 0;
  for (const TraceEvent& e : events) {
    if (e.end_ns < e.start_ns) continue;  // never recorded an end
    if (!spans.empty() && !in_a_step(e.start_ns)) continue;
    if (!e.device) {
      by_thread[e.thread].push_back(&e);
      continue;
    }
    add(kernels, e.name, ms(e.end_ns - e.start_ns));
    add(kinds, kernel_kind(e.name), ms(e.end_ns - e.start_ns));
    // Sorted by start: the busy union grows by what lies past the furthest end so far.
    const uint64_t from = std::max(e.start_ns, busy_until);
    if (e.end_ns > from) s.device_busy_ms += ms(e.end_ns - from);
    busy_until = std::max(busy_until, e.end_ns);
  }
  for (const auto& [thread, list] : by_thread) {
    const auto self = self_times(list);
    for (size_t i = 0; i < list.size(); ++i) add(host, list[i]->name, self[i]);
  }
  s.device_kernels = sorted_rows(kernels);
  s.device_kinds = sorted_rows(kinds);
  s.host_ops = sorted_rows(host);
  return s;
}

std::string format_trace_summary(const TraceSummary& s, size_t top) {
  std::string out;
  const double steps = static_cast<double>(std::max<int64_t>(s.steps, 1));
  auto table = [&](const char* what, const std::vector<TraceRow>& rows, double total) {
    out += fmt::format("  {:>10} {:>7} {:>7}  {}\n", "ms/step", "share", "calls",
                       what);  // calls: in the window
    for (size_t i = 0; i < std::min(top, rows.size()); ++i) {
      const TraceRow& r = rows[i];
      out += fmt::format("  {:>10.3f} {:>6.1f}% {:>7}  {}\n", r.ms / steps,
                         total > 0 ? 100.0 * r.ms / total : 0.0, r.calls, shown_name(r.name));
    }
  };
  if (!s.device_kernels.empty()) {
    out += fmt::format(
        "trace: {} step(s), {:.3f} ms/step wall; device busy {:.3f} ms/step ({:.1f}% of the "
        "wall time; kernels' share of the busy time below)\n",
        s.steps, s.wall_ms / steps, s.device_busy_ms / steps,
        s.wall_ms > 0 ? 100.0 * s.device_busy_ms / s.wall_ms : 0.0);
    double kernel_ms = 0;
    for (const auto& r : s.device_kinds) kernel_ms += r.ms;
    table("kind of kernel", s.device_kinds, kernel_ms);
    table("kernel", s.device_kernels, kernel_ms);
    return out;
  }
  out += fmt::format("trace: {} step(s), {:.3f} ms/step wall; host operators by self time\n",
                     s.steps, s.wall_ms / steps);
  table("operator", s.host_ops, s.wall_ms);
  return out;
}

}  // namespace moe::monitor
