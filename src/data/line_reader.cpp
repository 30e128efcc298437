#include "moe/data/line_reader.h"

#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <vector>

#include "moe/util/errors.h"

namespace moe::data {

// Fills a buffer with the next decompressed bytes; 0 at the end.
struct LineReader::Source {
  virtual ~Source() = default;
  virtual size_t read(char* out, size_t n) = 0;
  uint64_t consumed = 0;  // stored bytes read so far
};

namespace {

struct PlainSource : LineReader::Source {
  std::FILE* f;
  explicit PlainSource(std::FILE* file) : f(file) {}
  ~PlainSource() override { std::fclose(f); }
  size_t read(char* out, size_t n) override {
    const size_t got = std::fread(out, 1, n, f);
    consumed += got;
    return got;
  }
};

struct GzipSource : LineReader::Source {
  gzFile f;
  std::string path;
  GzipSource(gzFile file, std::string p) : f(file), path(std::move(p)) {}
  ~GzipSource() override { gzclose(f); }
  size_t read(char* out, size_t n) override {
    const int got = gzread(f, out, static_cast<unsigned>(n));
    int err = Z_OK;
    const char* msg = gzerror(f, &err);
    // A truncated stream ends with Z_BUF_ERROR ("unexpected end of file"), not with an error
    // return from gzread.
    if (got < 0 || (got == 0 && err != Z_OK)) {
      throw UserError("prepare-data: " + path + ": damaged or truncated gzip data (" + msg + ")");
    }
    consumed = static_cast<uint64_t>(gzoffset(f));
    return static_cast<size_t>(got);
  }
};

struct ZstdSource : LineReader::Source {
  std::FILE* f;
  std::string path;
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  std::vector<char> in = std::vector<char>(ZSTD_DStreamInSize());
  ZSTD_inBuffer input{in.data(), 0, 0};
  size_t last = 1;  // ZSTD_decompressStream's last return: 0 = a frame ended
  ZstdSource(std::FILE* file, std::string p) : f(file), path(std::move(p)) {}
  ~ZstdSource() override {
    ZSTD_freeDCtx(ctx);
    std::fclose(f);
  }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer output{out, n, 0};
    while (output.pos == 0) {
      if (input.pos == input.size) {
        input.size = std::fread(in.data(), 1, in.size(), f);
        input.pos = 0;
        consumed += input.size;
        if (input.size == 0) {
          if (last != 0) throw UserError("prepare-data: " + path + ": truncated zstd data");
          return 0;
        }
      }
      last = ZSTD_decompressStream(ctx, &output, &input);
      if (ZSTD_isError(last)) {
        throw UserError("prepare-data: " + path + ": damaged zstd data (" +
                        ZSTD_getErrorName(last) + ")");
      }
    }
    return output.pos;
  }
};

}  // namespace

LineReader::LineReader(const std::string& path) : path_(path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw UserError("prepare-data: " + path + ": cannot open for reading");
  if (path.ends_with(".gz")) {
    std::fclose(f);
    gzFile g = gzopen(path.c_str(), "rb");
    if (g == nullptr) throw UserError("prepare-data: " + path + ": cannot open for reading");
    gzbuffer(g, 1 << 20);
    src_ = std::make_unique<GzipSource>(g, path);
  } else if (path.ends_with(".zst")) {
    src_ = std::make_unique<ZstdSource>(f, path);
  } else {
    src_ = std::make_unique<PlainSource>(f);
  }
}

LineReader::~LineReader() = default;

uint64_t LineReader::bytes_read() const { return src_->consumed; }

bool LineReader::next(std::string& line) {
  line.clear();
  for (;;) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.append(buf_, pos_, nl - pos_);
      pos_ = nl + 1;
      break;
    }
    line.append(buf_, pos_, std::string::npos);
    buf_.clear();
    pos_ = 0;
    if (eof_) {
      if (line.empty()) return false;
      break;  // a last line without '\n'
    }
    buf_.resize(1 << 20);
    const size_t got = src_->read(buf_.data(), buf_.size());
    buf_.resize(got);
    if (got == 0) eof_ = true;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  ++line_;
  return true;
}

}  // namespace moe::data
