// Append-only JSON-lines metrics file: one object per line, flushed per line so a crash loses
// at most the line being written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moe::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Truncates, or appends (a resumed run continues the file).
  explicit MetricsLog(const std::string& path, bool append = false);
  int64_t lines() const { return lines_; }  // lines in the file
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  int64_t lines_ = 0;
};

}  // namespace moe::train
