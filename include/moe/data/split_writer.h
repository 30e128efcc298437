// One split ("train" or "valid") of a dataset being written by prepare-data: accumulates token
// ids (document starts, and with `loss_mask` a per-token mask), cuts them into HDF5 shards of a
// fixed size, and hashes each shard on another thread while the next one fills.
#pragma once

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "moe/data/manifest.h"

namespace moe::data {

class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, int64_t shard_tokens, int64_t vocab,
              std::string tokenizer, bool loss_mask = false);

  // The next append starts a document (its offset goes to the shard's doc_offsets).
  void begin_document() { docs_.push_back(static_cast<int64_t>(buf_.size())); }
  // Tokens, with their loss mask (1: a training target) when the split has one; without a mask
  // argument every token is a target.
  void append(const std::vector<uint32_t>& toks, const std::vector<uint8_t>* mask = nullptr);
  // Writes the last shard and waits for every hash: the split's manifest entries.
  std::vector<ManifestShard> finish();

 private:
  void flush();

  std::string dir_, split_;
  int64_t shard_tokens_, vocab_;
  std::string tokenizer_;
  int index_ = 0;
  std::vector<uint32_t> buf_;
  bool masked_ = false;
  std::vector<uint8_t> mask_;  // with masked_: one per token of buf_
  std::vector<int64_t> docs_;
  std::vector<std::future<ManifestShard>> pending_;
};

}  // namespace moe::data
