// s3:// datasets: a prepare-data directory in S3-compatible storage. Its manifest.json is read
// first; shards are fetched on first use with ranged GETs into a local cache directory, verified
// against the manifest (size, xxh3 and md5, then the HDF5 structure) before libhdf5 reads them,
// and evicted least-recently-used when the cache would exceed its bound. A background thread
// fetches shards the loader will read next. The ShardInfo list is the same one a local copy of
// the dataset gives, so the batch order, and exact resume, do not depend on where shards live.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/data/dataset.h"
#include "moe/data/manifest.h"
#include "moe/data/verify.h"

namespace moe::s3 {
class Client;
}

namespace moe::data {

struct RemoteCacheStats {
  int64_t fetched_shards = 0, fetched_bytes = 0, hits = 0, evictions = 0;
  double fetch_seconds = 0, waited_seconds = 0;  // downloading; pin() blocked on a fetch
};

// The splits of an s3:// dataset as ShardInfos backed by one cache; throws UserError naming the
// manifest's URL when it is missing or malformed, or the model's vocabulary is too small. Writes
// nothing until a shard is first read.
struct RemoteDataset {
  Manifest manifest;
  std::vector<ShardInfo> train, valid;
  std::shared_ptr<ShardFetcher> cache;
};
RemoteDataset open_remote_dataset(const std::string& url, const RemoteCacheOptions& opt,
                                  int64_t model_vocab_size,
                                  std::shared_ptr<s3::Client> client = nullptr);

// What a cache did so far (for logs and the loader benchmark).
RemoteCacheStats remote_cache_stats(const ShardFetcher& cache);

}  // namespace moe::data

namespace moe::data {

// prepare-data --out s3://...: the staged local dataset `dir` goes up shard by shard (multipart
// for large ones), manifest.json last, so the dataset is never visible as complete before every
// shard is there. Refuses (UserError) a destination that already holds a manifest.json.
// Returns the bytes uploaded.
int64_t upload_dataset(const std::string& dir, const std::string& url, s3::Client& client);
// The UserError when `url` already holds a dataset (checked before preparing anything).
void require_no_remote_dataset(const std::string& url, s3::Client& client);

// verify-data s3://...: each shard downloaded into `scratch_dir` in turn, checked against the
// manifest as a local one is (sizes, checksums, structure), then deleted. Problems name the
// objects' URLs.
std::vector<ShardProblem> verify_remote_dataset(const std::string& url, const VerifyOptions& opt,
                                                const std::string& scratch_dir, s3::Client& client);

}  // namespace moe::data
