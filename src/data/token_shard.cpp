#include "moe/data/token_shard.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "moe/util/errors.h"

namespace moe::data {

namespace fs = std::filesystem;

namespace {

// Owns one HDF5 identifier; the library's automatic error printing is switched off once so
// that failures reach the user as our one-line messages instead of HDF5's stack dumps.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void silence_hdf5() {
  static bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError("data: " + path + ": " + what);
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) fail(path, std::string("missing attribute '") + name + "'");
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(path, std::string("attribute '") + name + "' is not an integer");
  }
  H5Id space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(path, std::string("attribute '") + name + "' is not a scalar");
  }
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) {
    fail(path, std::string("cannot read attribute '") + name + "'");
  }
  return v;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  if (H5Aexists(obj, name) <= 0) return "";
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) {
    fail(path, std::string("attribute '") + name + "' is not a string");
  }
  // Handles both fixed-length (numpy bytes) and variable-length (h5py str) strings.
  if (H5Tis_variable_str(type.get()) > 0) {
    // Variable-length strings (h5py's default for str) are not read: libhdf5 1.10 trusts the
    // length stored in the file, and a damaged shard made it allocate 4 GiB (found by
    // fuzz/fuzz_data.cpp; tests/corpus/fuzz-regressions/data-vlen-string-4gib.bin). The
    // tokenizer name is informational; manifests carry it too.
    return "(variable-length string, not read)";
  }
  size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), n);
  H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
  if (H5Aread(attr.get(), mem.get(), s.data()) < 0) {
    fail(path, std::string("cannot read attribute '") + name + "'");
  }
  s.resize(std::strlen(s.c_str()));
  return s;
}

void write_int_attr(hid_t obj, const char* name, int64_t v) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(attr.get(), H5T_NATIVE_INT64, &v);
}

void write_string_attr(hid_t obj, const char* name, const std::string& v) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, v.size()));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(attr.get(), type.get(), v.c_str());
}

}  // namespace

ShardInfo inspect_shard(const std::string& path) {
  silence_hdf5();
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "file not found");
  if (!fs::is_regular_file(path, ec)) fail(path, "not a regular file");
  if (H5Fis_hdf5(path.c_str()) <= 0) fail(path, "not an HDF5 file (bad signature or truncated)");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) fail(path, "cannot open as HDF5 (damaged or truncated file)");
  if (H5Lexists(file.get(), "tokens", H5P_DEFAULT) <= 0) fail(path, "no dataset named 'tokens'");
  H5Id ds(H5Dopen2(file.get(), "tokens", H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) fail(path, "cannot open dataset 'tokens'");

  ShardInfo info;
  info.path = path;
  H5Id type(H5Dget_type(ds.get()), H5Tclose);
  size_t size = H5Tget_size(type.get());
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
      (size != 2 && size != 4)) {
    fail(path, "dataset 'tokens' has dtype of class " +
                   std::to_string(static_cast<int>(H5Tget_class(type.get()))) + " and size " +
                   std::to_string(size) + "; expected uint16 or uint32");
  }
  info.bytes_per_token = static_cast<int>(size);
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank != 1) fail(path, "dataset 'tokens' has rank " + std::to_string(rank) + "; expected 1");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  info.num_tokens = static_cast<int64_t>(n);

  info.format_version = read_int_attr(file.get(), "format_version", path);
  if (info.format_version != kShardFormatVersion) {
    fail(path, "format_version = " + std::to_string(info.format_version) + "; expected " +
                   std::to_string(kShardFormatVersion));
  }
  info.vocab_size = read_int_attr(file.get(), "vocab_size", path);
  if (info.vocab_size < 2) {
    fail(path, "vocab_size = " + std::to_string(info.vocab_size) + "; expected >= 2");
  }
  if (info.bytes_per_token < token_bytes(info.vocab_size)) {
    fail(path, "vocab_size = " + std::to_string(info.vocab_size) + " does not fit uint16 tokens");
  }
  info.tokenizer = read_string_attr(file.get(), "tokenizer", path);
  if (H5Lexists(file.get(), "loss_mask", H5P_DEFAULT) > 0) {
    H5Id mask(H5Dopen2(file.get(), "loss_mask", H5P_DEFAULT), H5Dclose);
    if (!mask.ok()) fail(path, "cannot open dataset 'loss_mask'");
    H5Id mtype(H5Dget_type(mask.get()), H5Tclose);
    H5Id mspace(H5Dget_space(mask.get()), H5Sclose);
    hsize_t m = 0;
    if (H5Tget_class(mtype.get()) != H5T_INTEGER || H5Tget_size(mtype.get()) != 1 ||
        H5Sget_simple_extent_ndims(mspace.get()) != 1) {
      fail(path, "dataset 'loss_mask' is not a 1-D uint8 dataset");
    }
    H5Sget_simple_extent_dims(mspace.get(), &m, nullptr);
    if (m != n) {
      fail(path, "dataset 'loss_mask' has " + std::to_string(m) +
                     " entries; expected one per token (" + std::to_string(n) + ")");
    }
    if (info.vocab_size > kNotTargetBit) {
      fail(path, "vocab_size = " + std::to_string(info.vocab_size) +
                     " is too large for a loss mask (at most 2^30)");
    }
    info.has_loss_mask = true;
  }
  return info;
}

std::vector<int32_t> read_tokens(const ShardInfo& shard, int64_t offset, int64_t count) {
  silence_hdf5();
  const std::string& path = shard.path;
  if (offset < 0 || count < 0 || offset + count > shard.num_tokens) {
    fail(path, "read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                   ") is outside the " + std::to_string(shard.num_tokens) + " tokens of the shard");
  }
  std::vector<int32_t> out(static_cast<size_t>(count));
  if (count == 0) return out;
  const std::shared_ptr<void> present = shard.remote ? shard.remote->pin(path) : nullptr;
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) fail(path, "cannot open as HDF5");
  H5Id ds(H5Dopen2(file.get(), "tokens", H5P_DEFAULT), H5Dclose);
  H5Id fspace(H5Dget_space(ds.get()), H5Sclose);
  hsize_t start = static_cast<hsize_t>(offset), cnt = static_cast<hsize_t>(count);
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
  H5Id mspace(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
  // HDF5 converts uint16/uint32 on disk to int32 in memory; ids >= 2^31 are rejected below.
  if (H5Dread(ds.get(), H5T_NATIVE_INT32, mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) <
      0) {
    fail(path, "read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                   ") failed (damaged or truncated file)");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] < 0 || out[i] >= shard.vocab_size) {
      fail(path, "token at offset " + std::to_string(offset + int64_t(i)) + " is " +
                     std::to_string(static_cast<uint32_t>(out[i])) + "; expected < vocab_size " +
                     std::to_string(shard.vocab_size));
    }
  }
  if (shard.has_loss_mask) {
    std::vector<uint8_t> mask(out.size());
    H5Id mds(H5Dopen2(file.get(), "loss_mask", H5P_DEFAULT), H5Dclose);
    H5Id mfspace(H5Dget_space(mds.get()), H5Sclose);
    H5Sselect_hyperslab(mfspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
    if (!mds.ok() || H5Dread(mds.get(), H5T_NATIVE_UINT8, mspace.get(), mfspace.get(), H5P_DEFAULT,
                             mask.data()) < 0) {
      fail(path, "read of loss_mask [" + std::to_string(offset) + ", " +
                     std::to_string(offset + count) + ") failed (damaged or truncated file)");
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (mask[i] == 0) out[i] |= kNotTargetBit;
    }
  }
  return out;
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size,
                 const std::string& tokenizer, std::span<const int64_t> doc_offsets,
                 std::span<const uint8_t> loss_mask) {
  silence_hdf5();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint64_t>(vocab_size)) {
      throw UserError("data: " + path + ": token " + std::to_string(tokens[i]) + " at offset " +
                      std::to_string(i) + " is >= vocab_size " + std::to_string(vocab_size));
    }
  }
  const bool narrow = token_bytes(vocab_size) == 2;
  std::string tmp = path + ".tmp";
  {
    // No object timestamps: the same input gives byte-identical shards (and manifest
    // checksums), so a dataset prepared twice, or locally and into S3, compares equal.
    H5Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_obj_track_times(fcpl.get(), false);
    H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
    if (!file.ok()) fail(tmp, "cannot create HDF5 file");
    hsize_t n = tokens.size();
    H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(dcpl.get(), false);
    H5Id plain_dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(plain_dcpl.get(), false);
    hsize_t chunk = std::clamp<hsize_t>(n, 1, 1 << 20);  // 1 Mi tokens per chunk
    H5Pset_chunk(dcpl.get(), 1, &chunk);
    H5Id ds(H5Dcreate2(file.get(), "tokens", narrow ? H5T_STD_U16LE : H5T_STD_U32LE, space.get(),
                       H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
            H5Dclose);
    if (!ds.ok()) fail(tmp, "cannot create dataset 'tokens'");
    if (n > 0 &&
        H5Dwrite(ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()) < 0) {
      fail(tmp, "write of " + std::to_string(n) + " tokens failed (disk full?)");
    }
    if (!doc_offsets.empty()) {
      hsize_t nd = doc_offsets.size();
      H5Id dspace(H5Screate_simple(1, &nd, nullptr), H5Sclose);
      H5Id docs(H5Dcreate2(file.get(), "doc_offsets", H5T_STD_I64LE, dspace.get(), H5P_DEFAULT,
                           plain_dcpl.get(), H5P_DEFAULT),
                H5Dclose);
      if (!docs.ok() || H5Dwrite(docs.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 doc_offsets.data()) < 0) {
        fail(tmp, "write of dataset 'doc_offsets' failed (disk full?)");
      }
    }
    if (!loss_mask.empty()) {
      if (loss_mask.size() != tokens.size()) fail(tmp, "loss_mask and tokens differ in length");
      H5Id mds(H5Dcreate2(file.get(), "loss_mask", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                          dcpl.get(), H5P_DEFAULT),
               H5Dclose);
      if (!mds.ok() || (n > 0 && H5Dwrite(mds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL,
                                          H5P_DEFAULT, loss_mask.data()) < 0)) {
        fail(tmp, "write of dataset 'loss_mask' failed (disk full?)");
      }
    }
    write_int_attr(file.get(), "format_version", kShardFormatVersion);
    write_int_attr(file.get(), "vocab_size", vocab_size);
    write_string_attr(file.get(), "tokenizer", tokenizer);
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) fail(tmp, "flush failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail(path, "cannot rename " + tmp + " into place: " + ec.message());
}

std::vector<std::string> list_shards(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file or directory");
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".h5") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) fail(path, "directory holds no *.h5 shards");
  return out;
}

}  // namespace moe::data
