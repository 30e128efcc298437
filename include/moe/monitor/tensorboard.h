// TensorBoard event files (events.out.tfevents.*), written without TensorFlow: TFRecord framing
// (length, masked CRC32C, payload, masked CRC32C) around hand-encoded `Event` protobufs with
// scalar and histogram summaries. Debian packages no TensorBoard writer for C++, and the few
// protobuf fields we need are easier to encode by hand than to generate from TensorFlow's .proto
// files; tests/monitor/tensorboard_test.py reads the files back with TensorBoard's own reader.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace moe::monitor {

class EventWriter {
 public:
  // Creates DIR (if needed) and DIR/events.out.tfevents.<time>.<host>.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event_payload);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// CRC32C (Castagnoli), as TFRecord uses; exposed for tests.
uint32_t crc32c(const void* data, size_t n);

}  // namespace moe::monitor
