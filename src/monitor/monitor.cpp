#include "moe/monitor/monitor.h"

#include <filesystem>
#include <map>
#include <span>

#include <nlohmann/json.hpp>

#include "moe/monitor/prometheus.h"
#include "moe/monitor/tensorboard.h"
#include "moe/util/errors.h"

namespace moe::monitor {

using nlohmann::json;

namespace {
// Scalar fields of a record (numbers), minus the bookkeeping ones; a blend's per-source figures
// flattened: eval "sources": {"web": {"loss": ..}} -> "sources/web/loss", train
// "source_passes": [1, 2] -> "source_passes/0", "source_passes/1" (data.blend order).
std::vector<std::pair<std::string, double>> scalars(const json& rec) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [k, v] : rec.items()) {
    if (k == "type" || k == "step" || k == "split") continue;
    if (v.is_number()) out.emplace_back(k, v.get<double>());
  }
  if (rec.contains("sources") && rec["sources"].is_object()) {
    for (const auto& [name, figures] : rec["sources"].items()) {
      for (const auto& [k, v] : figures.items()) {
        if (v.is_number()) out.emplace_back("sources/" + name + "/" + k, v.get<double>());
      }
    }
  }
  if (rec.contains("source_passes") && rec["source_passes"].is_array()) {
    const auto& p = rec["source_passes"];
    for (size_t i = 0; i < p.size(); ++i)
      out.emplace_back("source_passes/" + std::to_string(i), p[i].get<double>());
  }
  return out;
}

// A Prometheus label value: backslash, quote and newline escaped (exposition format).
std::string label_value(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

struct PromSpec {
  const char* field;
  const char* name;
  const char* type;
  const char* help;
};
constexpr PromSpec kTrain[] = {
    {"step", "moe_train_step", "gauge", "Optimizer steps done"},
    {"loss", "moe_train_loss", "gauge", "Language-model loss of the last step"},
    {"aux_loss", "moe_train_aux_loss", "gauge", "Load-balancing loss, summed over MoE layers"},
    {"z_loss", "moe_train_z_loss", "gauge", "Router z-loss, summed over MoE layers"},
    {"lr", "moe_train_learning_rate", "gauge", "Learning rate of the last step"},
    {"grad_norm", "moe_train_grad_norm", "gauge", "Global gradient norm before clipping"},
    {"tokens", "moe_train_tokens_total", "counter", "Training tokens consumed"},
    {"tokens_per_s", "moe_train_tokens_per_second", "gauge", "Throughput of the last step"},
    {"target_tokens", "moe_train_target_tokens", "gauge",
     "Tokens the last step took its loss on (SFT: the answers' tokens)"},
    {"step_time_s", "moe_train_step_seconds", "gauge",
     "Wall time of the last step, optimizer and host syncs included"},
    {"data_wait_s", "moe_train_data_wait_seconds", "gauge", "Time the last step waited for data"},
    {"loss_scale", "moe_train_loss_scale", "gauge", "fp16 loss scale"},
    {"skipped_steps", "moe_train_skipped_steps_total", "counter", "fp16 steps skipped on overflow"},
    {"host_rss_bytes", "moe_train_host_rss_bytes", "gauge", "Resident memory of the process"},
    {"epoch", "moe_train_epoch", "gauge", "Current data epoch"},
    {"tflops", "moe_train_model_tflops", "gauge", "Achieved model TFLOP/s per GPU, last step"},
    {"mfu", "moe_train_mfu", "gauge", "Model FLOPs utilisation vs the spec peak, last step"},
    {"mfu_causal", "moe_train_mfu_causal", "gauge", "MFU counting causal attention's half"},
    {"samples_per_s", "moe_train_samples_per_second", "gauge", "Sequences per second, last step"},
    {"gpu_utilization", "moe_train_gpu_utilization", "gauge", "NVML GPU utilisation (0..1)"},
    {"gpu_power_w", "moe_train_gpu_power_watts", "gauge", "NVML board power"},
    {"gpu_temperature_c", "moe_train_gpu_temperature_celsius", "gauge", "NVML GPU temperature"},
    {"gpu_mem_allocated_bytes", "moe_train_gpu_memory_allocated_bytes", "gauge",
     "CUDA caching allocator: allocated"},
    {"gpu_mem_reserved_bytes", "moe_train_gpu_memory_reserved_bytes", "gauge",
     "CUDA caching allocator: reserved"},
    {"gpu_mem_peak_bytes", "moe_train_gpu_memory_peak_bytes", "gauge",
     "CUDA caching allocator: peak allocated"},
    {"forward_s", "moe_train_forward_seconds", "gauge", "wall_clock_breakdown: forward"},
    {"backward_s", "moe_train_backward_seconds", "gauge", "wall_clock_breakdown: backward"},
    {"optimizer_s", "moe_train_optimizer_seconds", "gauge", "wall_clock_breakdown: optimizer"},
};
constexpr PromSpec kEval[] = {
    {"loss", "moe_train_eval_loss", "gauge", "Validation loss"},
    {"accuracy", "moe_train_eval_accuracy", "gauge", "Validation next-token accuracy"},
    {"perplexity", "moe_train_eval_perplexity", "gauge", "Validation perplexity"},
    {"step", "moe_train_eval_step", "gauge", "Step of the last validation"},
};
}  // namespace

Monitor::Monitor(const MonitorOptions& opt) : opt_(opt) {
  if (!opt.tensorboard_dir.empty()) tb_ = std::make_unique<EventWriter>(opt.tensorboard_dir);
  if (opt.prometheus_port > 0) {
    prom_ = std::make_unique<PrometheusExporter>(opt.prometheus_host, opt.prometheus_port);
  }
  if (!opt.csv_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt.csv_dir, ec);
    if (ec) throw UserError("csv_monitor: " + opt.csv_dir + ": cannot create: " + ec.message());
  }
}

Monitor::~Monitor() {
  for (auto& [k, c] : csv_) {
    if (c.f) std::fclose(c.f);
  }
}

void Monitor::record(const json& rec) {
  const std::string kind = rec.value("type", std::string("train"));
  const int64_t step = rec.value("step", int64_t{0});
  if (tb_) {
    for (const auto& [k, v] : scalars(rec)) tb_->add_scalar(kind + "/" + k, v, step);
    if (rec.contains("expert_tokens")) {
      const auto& layers = rec["expert_tokens"];
      for (size_t l = 0; l < layers.size(); ++l) {
        tb_->add_histogram("train/expert_tokens/layer" + std::to_string(l),
                           layers[l].get<std::vector<double>>(), step);
      }
    }
    tb_->flush();
  }
  if (!opt_.csv_dir.empty()) record_csv(kind, rec);
  if (prom_) record_prometheus(rec);
}

void Monitor::record_csv(const std::string& kind, const json& rec) {
  Csv& c = csv_[kind];
  auto values = scalars(rec);
  if (c.f == nullptr) {
    const std::string path = (std::filesystem::path(opt_.csv_dir) / (kind + ".csv")).string();
    c.f = std::fopen(path.c_str(), "w");
    if (c.f == nullptr) throw UserError("csv_monitor: " + path + ": cannot create");
    c.columns.push_back("step");
    for (const auto& [k, v] : values) c.columns.push_back(k);
    for (size_t i = 0; i < c.columns.size(); ++i) {
      std::fprintf(c.f, "%s%s", i ? "," : "", c.columns[i].c_str());
    }
    std::fprintf(c.f, "\n");
  }
  const std::map<std::string, double> by_name(values.begin(), values.end());
  for (size_t i = 0; i < c.columns.size(); ++i) {
    const auto& col = c.columns[i];
    std::fprintf(c.f, "%s", i ? "," : "");
    if (col == "step") {
      std::fprintf(c.f, "%lld", static_cast<long long>(rec.value("step", int64_t{0})));
    } else if (const auto it = by_name.find(col); it != by_name.end()) {
      std::fprintf(c.f, "%.9g", it->second);
    }
  }
  std::fprintf(c.f, "\n");
  std::fflush(c.f);
}

void Monitor::record_prometheus(const json& rec) {
  const bool eval = rec.value("type", std::string()) == "eval";
  std::vector<PrometheusExporter::Sample> samples;
  for (const auto& s :
       eval ? std::span<const PromSpec>(kEval) : std::span<const PromSpec>(kTrain)) {
    if (rec.contains(s.field) && rec[s.field].is_number()) {
      samples.push_back({s.name, s.type, s.help, "", rec[s.field].get<double>()});
    }
  }
  if (eval && rec.contains("sources") && rec["sources"].is_object()) {
    for (const auto& [name, f] : rec["sources"].items()) {
      const std::string label = "{source=\"" + label_value(name) + "\"}";
      samples.push_back({"moe_train_eval_source_loss", "gauge", "Validation loss of a blend source",
                         label, f.value("loss", 0.0)});
      samples.push_back({"moe_train_eval_source_accuracy", "gauge",
                         "Validation next-token accuracy of a blend source", label,
                         f.value("accuracy", 0.0)});
    }
  }
  if (!eval && rec.contains("source_passes") && rec["source_passes"].is_array()) {
    const auto& p = rec["source_passes"];
    for (size_t i = 0; i < p.size(); ++i) {
      samples.push_back({"moe_train_source_pass", "gauge",
                         "Pass over each blend source (1 = first; data.blend order)",
                         "{source=\"" + std::to_string(i) + "\"}", p[i].get<double>()});
    }
  }
  if (!eval && rec.contains("expert_tokens")) {
    const auto& layers = rec["expert_tokens"];
    for (size_t l = 0; l < layers.size(); ++l) {
      for (size_t e = 0; e < layers[l].size(); ++e) {
        samples.push_back(
            {"moe_train_expert_tokens", "gauge", "Assignments per expert in the last step",
             "{layer=\"" + std::to_string(l) + "\",expert=\"" + std::to_string(e) + "\"}",
             layers[l][e].get<double>()});
      }
    }
  }
  prom_->set(samples);
}

void Monitor::flush() {
  if (tb_) tb_->flush();
}

}  // namespace moe::monitor
