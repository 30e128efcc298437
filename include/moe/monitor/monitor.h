// One place the trainer hands every metrics record to; it fans out to the configured sinks:
// TensorBoard event files, CSV files and the Prometheus endpoint (the JSON-lines file is written
// by the trainer itself, see train/metrics_log.h). Records are the JSON objects of the metrics
// file ({"type": "train" | "eval", "step": ..., ...}).
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::monitor {

class EventWriter;
class PrometheusExporter;

struct MonitorOptions {
  std::string tensorboard_dir;  // empty = off
  std::string csv_dir;          // empty = off
  int prometheus_port = 0;      // 0 = off
  std::string prometheus_host = "127.0.0.1";
};

class Monitor {
 public:
  explicit Monitor(const MonitorOptions& opt);
  ~Monitor();
  void record(const nlohmann::json& rec);
  void flush();

 private:
  void record_csv(const std::string& kind, const nlohmann::json& rec);
  void record_prometheus(const nlohmann::json& rec);

  MonitorOptions opt_;
  std::unique_ptr<EventWriter> tb_;
  std::unique_ptr<PrometheusExporter> prom_;
  struct Csv {
    std::FILE* f = nullptr;
    std::vector<std::string> columns;
  };
  std::map<std::string, Csv> csv_;
};

}  // namespace moe::monitor
