#include "moe/monitor/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "moe/util/errors.h"

namespace moe::monitor {

namespace {

// ---- protobuf wire format: just what Event / Summary / HistogramProto need ----
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire) {
  varint(out, (uint64_t(field) << 3) | uint64_t(wire));
}
void fixed64(std::string& out, int field, double d) {
  tag(out, field, 1);
  uint64_t u;
  std::memcpy(&u, &d, 8);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(u >> (8 * i)));
}
void fixed32(std::string& out, int field, float f) {
  tag(out, field, 5);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(u >> (8 * i)));
}
void bytes(std::string& out, int field, const std::string& s) {
  tag(out, field, 2);
  varint(out, s.size());
  out += s;
}
void packed_doubles(std::string& out, int field, const std::vector<double>& v) {
  std::string p;
  for (double d : v) {
    uint64_t u;
    std::memcpy(&u, &d, 8);
    for (int i = 0; i < 8; ++i) p.push_back(static_cast<char>(u >> (8 * i)));
  }
  bytes(out, field, p);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  fixed64(e, 1, now_seconds());
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  if (file_version) bytes(e, 3, *file_version);
  if (summary) bytes(e, 5, *summary);
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static uint32_t table[256];
  static const bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ =
      (std::filesystem::path(dir) /
       ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host))
          .string();
  f_ = std::fopen(path_.c_str(), "ab");
  if (f_ == nullptr) throw UserError("tensorboard: " + path_ + ": cannot create");
  const std::string version = "brain.Event:2";
  write_event(event(0, &version, nullptr));
  flush();
}

EventWriter::~EventWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void EventWriter::write_event(const std::string& e) {
  std::string rec;
  const uint64_t n = e.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  auto put32 = [&rec](uint32_t v) {
    for (int i = 0; i < 4; ++i) rec.push_back(static_cast<char>(v >> (8 * i)));
  };
  rec.append(len, 8);
  put32(masked(crc32c(len, 8)));
  rec += e;
  put32(masked(crc32c(e.data(), e.size())));
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size()) {
    throw TrainingError("tensorboard: " + path_ + ": write failed (disk full?)");
  }
}

void EventWriter::add_scalar(const std::string& name, double value, int64_t step) {
  std::string v;  // Summary.Value { string tag = 1; float simple_value = 2; }
  bytes(v, 1, name);
  fixed32(v, 2, static_cast<float>(value));
  std::string summary;
  bytes(summary, 1, v);
  write_event(event(step, nullptr, &summary));
}

void EventWriter::add_histogram(const std::string& name, const std::vector<double>& values,
                                int64_t step) {
  if (values.empty()) return;
  // HistogramProto { min 1; max 2; num 3; sum 4; sum_squares 5; bucket_limit 6; bucket 7 }:
  // one bucket per distinct value position, so TensorBoard shows the per-expert shape.
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0, sq = 0;
  for (double x : values) {
    sum += x;
    sq += x * x;
  }
  std::vector<double> limits, counts;
  for (double x : sorted) {
    if (limits.empty() || x > limits.back()) {
      limits.push_back(x);
      counts.push_back(1);
    } else {
      counts.back() += 1;
    }
  }
  std::string h;
  fixed64(h, 1, sorted.front());
  fixed64(h, 2, sorted.back());
  fixed64(h, 3, static_cast<double>(values.size()));
  fixed64(h, 4, sum);
  fixed64(h, 5, sq);
  packed_doubles(h, 6, limits);
  packed_doubles(h, 7, counts);
  std::string v;  // Summary.Value { tag = 1; HistogramProto histo = 5; }
  bytes(v, 1, name);
  bytes(v, 5, h);
  std::string summary;
  bytes(summary, 1, v);
  write_event(event(step, nullptr, &summary));
}

void EventWriter::flush() { std::fflush(f_); }

}  // namespace moe::monitor
