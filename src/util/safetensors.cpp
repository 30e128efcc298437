#include "moe/util/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"

namespace moe {

using nlohmann::json;

namespace {
constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the format's own limit is 100 MB

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw UserError("safetensors: " + path + ": " + what);
}

void write_all(int fd, const void* p, size_t n, const std::string& path, size_t total) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw TrainingError("checkpoint: " + path + ": write failed (" + std::strerror(errno) +
                          "); the file needs " + std::to_string(total) + " bytes");
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}
// One tensor's header entry, checked against the data section's size.
SafeTensorEntry parse_entry(const std::string& path, const std::string& name, const json& v,
                            uint64_t data_size) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
      !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
      !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
    bad(path, "tensor '" + name + "': needs dtype, shape and data_offsets [begin, end]");
  }
  SafeTensorEntry e;
  e.dtype = v["dtype"].get<std::string>();
  const size_t esize = safetensors_dtype_size(e.dtype);
  if (esize == 0) bad(path, "tensor '" + name + "': unknown dtype " + e.dtype);
  uint64_t count = 1;
  for (const auto& d : v["shape"]) {
    if (d.is_number_integer() && !d.is_number_unsigned()) {
      bad(path, "tensor '" + name + "': shape holds a negative dimension " + d.dump());
    }
    if (!d.is_number_unsigned()) bad(path, "tensor '" + name + "': shape holds a non-integer");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && count > (uint64_t(1) << 62) / dim)
      bad(path, "tensor '" + name + "': shape overflows");
    count *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  const auto& off = v["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    bad(path, "tensor '" + name + "': data_offsets must be non-negative integers");
  }
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    bad(path, "tensor '" + name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + ") outside the " + std::to_string(data_size) +
                  "-byte data section");
  }
  if (count > (uint64_t(1) << 62) / esize || e.end - e.begin != count * esize) {
    bad(path, "tensor '" + name + "': " + std::to_string(e.end - e.begin) + " bytes for " +
                  e.dtype + " shape of " + std::to_string(count) + " elements");
  }
  return e;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<SafeTensorView>& layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : layout) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
    sizes_.push_back(t.nbytes);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes, as the spec allows
  const uint64_t n = h.size();
  total_ = 8 + h.size() + offset;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) {
    throw TrainingError("checkpoint: " + path + ": cannot create (" + std::strerror(errno) + ")");
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  write_all(fd_, len, 8, path_, total_);
  write_all(fd_, h.data(), h.size(), path_, total_);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::append(const void* data, size_t nbytes) {
  if (next_ >= sizes_.size() || sizes_[next_] != nbytes) {
    throw std::logic_error("safetensors writer: " + path_ + ": tensor " + std::to_string(next_) +
                           " has " + std::to_string(nbytes) + " bytes, not the layout's");
  }
  write_all(fd_, data, nbytes, path_, total_);
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != sizes_.size()) {
    throw std::logic_error("safetensors writer: " + path_ + ": " + std::to_string(next_) + " of " +
                           std::to_string(sizes_.size()) + " tensors written");
  }
  if (::fsync(fd_) != 0) {
    throw TrainingError("checkpoint: " + path_ + ": fsync failed (" + std::strerror(errno) + ")");
  }
  ::close(fd_);
  fd_ = -1;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, tensors, metadata);
  for (const auto& t : tensors) w.append(t.data, t.nbytes);
  w.finish();
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  struct File {  // closed on every path out, errors included
    int fd;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDONLY)};
  if (file.fd < 0) bad(path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st {};
  ::fstat(file.fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_exact = [&](void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = ::read(file.fd, c, n);
      if (r <= 0) bad(path, "short read (truncated file?)");
      c += r;
      n -= static_cast<size_t>(r);
    }
  };
  if (size < 8) bad(path, "file is " + std::to_string(size) + " bytes; too short for a header");
  unsigned char len[8];
  read_exact(len, 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  if (n > kMaxHeader || n > size - 8) {
    bad(path, "header length " + std::to_string(n) + " runs past the end of the " +
                  std::to_string(size) + "-byte file");
  }
  std::string h(n, '\0');
  read_exact(h.data(), n);
  const uint64_t data_size = size - 8 - n;
  json header;
  try {
    header = json::parse(h);
  } catch (const json::exception& e) {
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) bad(path, "header is not a JSON object");
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not an object");
      for (const auto& [k, val] : v.items()) {
        if (!val.is_string()) bad(path, "__metadata__." + k + " is not a string");
        metadata_[k] = val.get<std::string>();
      }
      continue;
    }
    SafeTensorEntry e = parse_entry(path, name, v, data_size);
    ranges.emplace_back(e.begin, e.end);
    entries_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) bad(path, "tensor data ranges overlap");
  }
  // Checked: now the data section is memory-mapped, not read. Pages come in as tensors are
  // copied out and release() gives them back, so a reader holds about one tensor of a file.
  map_size_ = static_cast<size_t>(size);
  void* base = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (base == MAP_FAILED) bad(path, std::string("cannot map (") + std::strerror(errno) + ")");
  map_ = static_cast<char*>(base);
  data_ = map_ + 8 + n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void SafetensorsFile::release(const SafeTensorEntry& e) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_ + e.begin);
  const auto end = reinterpret_cast<uintptr_t>(data_ + e.end);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  // Only whole pages inside the tensor: its neighbours' bytes stay where they are.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

const SafeTensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) bad(path_, "missing tensor '" + name + "'");
  return it->second;
}

}  // namespace moe
