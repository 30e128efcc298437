// Which shards a run reads, checked before training starts: a dataset directory with a
// manifest.json (prepare-data's output), or raw shard paths (a file or a directory of *.h5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/token_shard.h"

namespace moe::data {

struct LoaderState {  // small and exact: enough to resume the same batch sequence
  int64_t epoch = 0;
  int64_t position = 0;  // windows consumed in this epoch
};

// s3:// datasets (remote_dataset.h): their local shard cache. Each dataset gets its own
// subdirectory DIR/BUCKET/PREFIX.
struct RemoteCacheOptions {
  std::string dir;        // where shards are kept
  int64_t max_bytes = 0;  // 0 = unbounded
  int prefetch_threads = 1;
};

struct DatasetPaths {
  std::string dataset_dir;  // with manifest.json (or s3://bucket/prefix): splits "train", "valid"
  std::string train_path;   // else raw shards
  std::string valid_path;
};

// One source of a weighted blend: a prepare-data directory (manifest.json; its "valid" split
// is the source's validation data) or raw shards (with optional held-out shards).
struct BlendSourcePaths {
  std::string name;
  double weight = 1.0;
  std::string path;
  std::string valid_path;
};

struct SourceShards {
  std::string name;
  double weight = 1.0;
  std::vector<ShardInfo> train, valid;
};

struct DatasetShards {
  std::vector<ShardInfo> train;
  std::vector<ShardInfo> valid;  // empty: no validation
  bool scanned = false;          // raw shards were scanned for out-of-range tokens
  // A blend's sources, in data.blend order; train and valid above then hold all of them.
  std::vector<SourceShards> sources;
};

// Opens and checks every shard (structure, attributes, vocabulary, one window at least; with a
// manifest: sizes and max token id, and full checksums when `checksums`; without one: a scan of
// all token ids, since nothing else vouches for them). Throws UserError naming the file.
DatasetShards open_dataset(const DatasetPaths& paths, int64_t model_vocab_size, int64_t seq_len,
                           bool checksums, const RemoteCacheOptions& cache = {});

// open_dataset for each source of a blend; an error names the source ("data.blend[1] (web): ").
DatasetShards open_blend(const std::vector<BlendSourcePaths>& sources, int64_t model_vocab_size,
                         int64_t seq_len, bool checksums, const RemoteCacheOptions& cache = {});

// Share of next-token targets (all window positions but the first) equal to the most frequent
// one: the accuracy of always predicting that token. Reads the shards in bounded chunks.
double majority_baseline(const std::vector<ShardInfo>& shards, int64_t seq_len);

}  // namespace moe::data
