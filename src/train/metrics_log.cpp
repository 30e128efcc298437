#include "moe/train/metrics_log.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"

namespace moe::train {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (append) {
    if (std::FILE* r = std::fopen(path.c_str(), "r")) {
      for (int c; (c = std::fgetc(r)) != EOF;) lines_ += c == '\n';
      std::fclose(r);
    }
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (f_ == nullptr) {
    throw UserError("metrics: " + path + ": cannot open for writing: " + std::strerror(errno));
  }
}

MetricsLog::~MetricsLog() {
  if (f_ != nullptr) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (f_ == nullptr) return;
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0) {
    throw TrainingError("metrics: " + path_ + ": write failed: " + std::strerror(errno));
  }
  ++lines_;
}

}  // namespace moe::train
