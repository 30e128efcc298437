// Lines of a text file, plain or compressed (.gz with Debian's zlib, .zst with libzstd), read in
// constant memory: JSONL input of prepare-data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace moe::data {

class LineReader {
 public:
  // Compression from the file name (.gz, .zst); UserError naming the file when it cannot be read.
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // The next line without its '\n' (and '\r'); false at the end. UserError on damaged input.
  bool next(std::string& line);
  int64_t line_number() const { return line_; }  // 1-based number of the last line read
  uint64_t bytes_read() const;                   // of the file as stored (for progress)

  struct Source;  // plain, gzip or zstd bytes (line_reader.cpp)

 private:
  std::unique_ptr<Source> src_;
  std::string path_, buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
};

}  // namespace moe::data
