// HDF5 token shards: one 1-D dataset `tokens` (uint16 when the vocabulary fits, else uint32),
// chunked, with attributes format_version, vocab_size, tokenizer. docs/data-format.md has the
// h5py recipe. All failures throw UserError naming the file and what was expected.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moe::data {

inline constexpr int64_t kShardFormatVersion = 1;

struct ShardInfo {
  std::string path;
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t format_version = 0;
  int bytes_per_token = 0;  // 2 (uint16) or 4 (uint32)
  std::string tokenizer;
};

// Opens the file and checks its structure and attributes (cheap: no token data is read).
ShardInfo inspect_shard(const std::string& path);

// Reads tokens [offset, offset + count) as one contiguous hyperslab.
std::vector<int32_t> read_tokens(const ShardInfo& shard, int64_t offset, int64_t count);

// Writes a shard atomically (temporary name, then rename). Token ids must be < vocab_size.
// doc_offsets (optional): start offset of each document, written as dataset `doc_offsets`.
void write_shard(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size,
                 const std::string& tokenizer, std::span<const int64_t> doc_offsets = {});

// A shard path, or a directory whose *.h5 files (sorted by name) are the shards.
std::vector<std::string> list_shards(const std::string& path);

}  // namespace moe::data
