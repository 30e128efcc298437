// Append-only JSON-lines metrics file: one object per line, flushed per line so a crash loses
// at most the line being written.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moe::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::string& path);  // truncates
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace moe::train
