// Dataset checks. Cheap ones (sizes, HDF5 structure and attributes against the manifest and the
// model's vocabulary) run at every training start; full checksums on request
// (data.verify_checksums) and in `moe-train verify-data`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/manifest.h"
#include "moe/data/token_shard.h"

namespace moe::data {

struct ShardProblem {
  std::string file;    // path of the shard (or manifest)
  std::string reason;  // one line
};

struct VerifyOptions {
  bool checksums = true;         // recompute md5 and xxh3
  int64_t model_vocab_size = 0;  // 0: do not compare with a model
  int threads = 2;               // shards hashed concurrently
};

// Problems of one shard (at `path`) against its manifest entry; "" when it is fine.
std::string check_shard(const std::string& path, const ManifestShard& s, const Manifest& m,
                        const VerifyOptions& opt);
// Every problem of every shard of every split (empty = all good).
std::vector<ShardProblem> verify_dataset(const std::string& dir, const VerifyOptions& opt);

// The shards of one split, checked cheaply (throws UserError at the first problem).
std::vector<ShardInfo> open_split(const std::string& dir, const std::string& split,
                                  int64_t model_vocab_size, bool checksums);

}  // namespace moe::data
