#include "moe/monitor/flops_report.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace moe::monitor {

namespace {

std::string row(const std::string& name, const std::string& params, const std::string& flops,
                double latency_s, double share) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-16s %14s %14s %12.3f %7.1f%%\n", name.c_str(), params.c_str(),
                flops.c_str(), latency_s * 1e3, share * 100);
  return buf;
}

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6e", x);
  return buf;
}

}  // namespace

std::string flops_report(const config::Config& cfg, const StepTimes& t,
                         const std::vector<ModuleTiming>& timings) {
  const auto& p = cfg.flops_profiler;
  const double tokens = static_cast<double>(cfg.train_batch_size * cfg.model.seq_len);
  std::map<std::string, double> seconds;
  for (const auto& m : timings) seconds[m.name] += m.seconds;
  const double step_s = t.step_s > 0 ? t.step_s : 1;
  std::string out;
  char head[512];
  std::snprintf(head, sizeof head,
                "flops profiler: step %lld, %.0f tokens, step %.3f s (forward %.3f s, backward "
                "%.3f s, optimizer %.3f s); FLOPs are forward + backward = 3 x forward\n",
                static_cast<long long>(t.step), tokens, t.step_s, t.forward_s, t.backward_s,
                t.optimizer_s);
  out += head;
  char columns[128];
  std::snprintf(columns, sizeof columns, "%-16s %14s %14s %12s %8s\n", "module", "params", "flops",
                "latency_ms", "share");
  out += columns;
  int64_t params = 0;
  double flops = 0;
  for (const config::ModuleCost& m : config::module_costs(cfg)) {
    const double n = static_cast<double>(m.count);
    const int64_t mp = m.params * static_cast<int64_t>(n);
    const double mf = 3 * m.forward_flops_per_token * n * tokens;
    params += mp;
    flops += mf;
    out += row(m.name, std::to_string(mp), sci(mf), seconds[m.name], seconds[m.name] / step_s);
  }
  out += row("optimizer", "-", "-", t.optimizer_s, t.optimizer_s / step_s);
  out += row("total", std::to_string(params), sci(flops), t.step_s, 1.0);
  char rate[128];
  std::snprintf(rate, sizeof rate, "achieved: %.4g FLOP/s over the step\n", flops / step_s);
  out += rate;

  // The slowest modules (per layer where measured per layer).
  std::vector<ModuleTiming> sorted = timings;
  std::sort(sorted.begin(), sorted.end(),
            [](const ModuleTiming& a, const ModuleTiming& b) { return a.seconds > b.seconds; });
  out += "top modules by forward latency:\n";
  for (int64_t i = 0; i < p.top_modules && i < static_cast<int64_t>(sorted.size()); ++i) {
    const auto& m = sorted[static_cast<size_t>(i)];
    const std::string name = m.layer >= 0 ? m.name + "." + std::to_string(m.layer) : m.name;
    out += row("  " + name, "", "", m.seconds, m.seconds / step_s);
  }
  if (p.detailed && p.module_depth != 1) {
    out += "per layer:\n";
    for (const auto& m : timings) {
      if (m.layer < 0) continue;
      out +=
          row("  " + m.name + "." + std::to_string(m.layer), "", "", m.seconds, m.seconds / step_s);
    }
  }
  return out;
}

}  // namespace moe::monitor
