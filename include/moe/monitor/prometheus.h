// A Prometheus /metrics endpoint. The trainer sets gauges and counters; each scrape renders the
// text exposition format (version 0.0.4) from one consistent snapshot. Binds to 127.0.0.1 unless
// told otherwise. Hand-written (one thread, poll + accept, GET /metrics only): Debian 12 packages
// no prometheus-cpp, and Debian's civetweb starts its threads with a small fixed stack that
// cannot hold LibTorch's static TLS (pthread_create fails with EINVAL inside moe-train).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moe::monitor {

class PrometheusExporter {
 public:
  // Throws UserError naming host:port when it cannot listen.
  PrometheusExporter(const std::string& host, int port);
  ~PrometheusExporter();
  PrometheusExporter(const PrometheusExporter&) = delete;
  PrometheusExporter& operator=(const PrometheusExporter&) = delete;

  struct Sample {
    std::string name, type, help;
    std::string labels;  // `{layer="0",expert="3"}` or ""
    double value = 0;
  };
  // Sets all samples under one lock: a scrape sees all of a step's values or none.
  void set(const std::vector<Sample>& samples);
  std::string render() const;

 private:
  struct Family {
    std::string type, help;
    std::map<std::string, double> samples;  // labels -> value
  };
  void serve();
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace moe::monitor
