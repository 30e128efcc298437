// HDF5 token shards: one 1-D dataset `tokens` (uint16 when the vocabulary fits, else uint32),
// chunked, with attributes format_version, vocab_size, tokenizer; optionally `doc_offsets`
// (int64 document starts) and `loss_mask` (uint8 per token, supervised fine-tuning data: 1 where
// the token is a training target, 0 where it is not, e.g. a prompt). docs/data-format.md has the
// h5py recipe. All failures throw UserError naming the file and what was expected.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moe::data {

inline constexpr int64_t kShardFormatVersion = 1;

// read_tokens marks a token that is not a training target (loss_mask 0) with this bit, so that
// the mask travels with the ids through the loader's windows and batches; kTokenIdBits strips
// it (train/loss_targets.h).
inline constexpr int32_t kNotTargetBit = int32_t(1) << 30;
inline constexpr int32_t kTokenIdBits = kNotTargetBit - 1;

// Where a shard's file comes from when it is not on a local filesystem (remote_dataset.h):
// pin() makes the file present at ShardInfo::path until the returned handle is dropped;
// prefetch() asks for it ahead of need, without waiting.
class ShardFetcher {
 public:
  virtual ~ShardFetcher() = default;
  virtual std::shared_ptr<void> pin(const std::string& path) = 0;
  virtual void prefetch(const std::string& path) = 0;
};

struct ShardInfo {
  std::string path;
  std::shared_ptr<ShardFetcher> remote;  // set for shards of an s3:// dataset
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t format_version = 0;
  int bytes_per_token = 0;  // 2 (uint16) or 4 (uint32)
  std::string tokenizer;
  bool has_loss_mask = false;  // a `loss_mask` dataset beside `tokens`
};

// Bytes per token on disk for a vocabulary: uint16 when every id fits (vocab_size <= 65536),
// else uint32. The one rule for the writer, the reader's checks and an s3:// dataset's sizes.
inline int token_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Opens the file and checks its structure and attributes (cheap: no token data is read).
ShardInfo inspect_shard(const std::string& path);

// Reads tokens [offset, offset + count) as one contiguous hyperslab; with a loss mask, tokens
// that are not targets carry kNotTargetBit.
std::vector<int32_t> read_tokens(const ShardInfo& shard, int64_t offset, int64_t count);

// Writes a shard atomically (temporary name, then rename). Token ids must be < vocab_size.
// doc_offsets (optional): start offset of each document, written as dataset `doc_offsets`;
// loss_mask (optional, one per token): written as dataset `loss_mask`.
void write_shard(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size,
                 const std::string& tokenizer, std::span<const int64_t> doc_offsets = {},
                 std::span<const uint8_t> loss_mask = {});

// A shard path, or a directory whose *.h5 files (sorted by name) are the shards.
std::vector<std::string> list_shards(const std::string& path);

}  // namespace moe::data
