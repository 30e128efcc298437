// safetensors files (https://github.com/huggingface/safetensors, format: 8-byte little-endian
// header length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {str: str}}, then the raw little-endian data). No C++ library for it is packaged
// by Debian, and the format is small, so this reader/writer is ours. The reader checks every
// length and offset against the file size before it allocates anything.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moe {

struct SafeTensorView {  // for writing
  std::string name;
  std::string dtype;  // F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

struct SafeTensorEntry {  // as read
  std::string dtype;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // offsets into the data section
};

// Bytes per element of a safetensors dtype, 0 when unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// Writes `path` (plain write + fsync; the caller makes it atomic by renaming its directory).
// Throws TrainingError naming the path and the bytes needed on a write failure (disk full).
void write_safetensors(const std::string& path, const std::vector<SafeTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same file written tensor by tensor: the header from `layout` (names, dtypes, shapes, byte
// counts; data unused), then append() each tensor's bytes in layout order, then finish() (fsync).
// For data produced just in time (a ZeRO checkpoint gathers one state tensor at a time).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<SafeTensorView>& layout,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void append(const void* data, size_t nbytes);
  void finish();

 private:
  std::string path_;
  std::vector<size_t> sizes_;
  size_t next_ = 0, total_ = 0;
  int fd_ = -1;
};

class SafetensorsFile {
 public:
  // Validates the header against the file size (throws UserError naming the file and the
  // problem) and memory-maps the file read-only.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::map<std::string, SafeTensorEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws UserError when the tensor is missing.
  const SafeTensorEntry& entry(const std::string& name) const;
  const char* data(const SafeTensorEntry& e) const { return data_ + e.begin; }
  // The tensor's bytes are no longer needed: their pages leave memory (a later data() maps them
  // in again from the file).
  void release(const SafeTensorEntry& e) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, SafeTensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
  char* map_ = nullptr;
  size_t map_size_ = 0;
  const char* data_ = nullptr;  // the data section, inside the mapping
};

}  // namespace moe
