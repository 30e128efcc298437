#include "moe/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "moe/data/manifest.h"
#include "moe/data/remote_dataset.h"
#include "moe/data/streaming_loader.h"
#include "moe/data/verify.h"
#include "moe/util/errors.h"
#include "moe/util/s3_client.h"

namespace moe::data {

namespace {

constexpr int64_t kScanChunk = int64_t(4) << 20;  // tokens per read when scanning

std::vector<ShardInfo> open_raw(const std::string& path, int64_t model_vocab_size) {
  std::vector<ShardInfo> out;
  for (const auto& p : list_shards(path)) {
    ShardInfo info = inspect_shard(p);
    if (info.vocab_size > model_vocab_size) {
      throw UserError("data: " + p + ": shard vocab_size " + std::to_string(info.vocab_size) +
                      " exceeds model.vocab_size " + std::to_string(model_vocab_size));
    }
    // read_tokens rejects any id >= the shard's vocab_size, with its offset.
    for (int64_t off = 0; off < info.num_tokens; off += kScanChunk) {
      read_tokens(info, off, std::min(kScanChunk, info.num_tokens - off));
    }
    out.push_back(info);
  }
  return out;
}

}  // namespace

DatasetShards open_dataset(const DatasetPaths& paths, int64_t model_vocab_size, int64_t seq_len,
                           bool checksums, const RemoteCacheOptions& cache) {
  DatasetShards d;
  for (const std::string* raw : {&paths.train_path, &paths.valid_path}) {
    if (s3::is_s3_url(*raw)) {
      throw UserError("data: " + *raw +
                      ": s3:// works for prepare-data datasets (their manifest carries the "
                      "checksums each fetched shard is verified against); give it as data.path");
    }
  }
  if (s3::is_s3_url(paths.dataset_dir)) {
    const s3::Url url = s3::parse_url(paths.dataset_dir, "data");
    RemoteCacheOptions one = cache;
    one.dir = (std::filesystem::path(cache.dir) / url.bucket / url.key).string();
    RemoteDataset r = open_remote_dataset(paths.dataset_dir, one, model_vocab_size);
    d.train = std::move(r.train);
    d.valid = std::move(r.valid);
  } else if (!paths.dataset_dir.empty()) {
    d.train = open_split(paths.dataset_dir, "train", model_vocab_size, checksums);
    Manifest m = load_manifest(paths.dataset_dir);
    if (m.splits.count("valid") != 0 && !m.splits["valid"].empty()) {
      d.valid = open_split(paths.dataset_dir, "valid", model_vocab_size, checksums);
    }
  } else {
    d.train = open_raw(paths.train_path, model_vocab_size);
    if (!paths.valid_path.empty()) d.valid = open_raw(paths.valid_path, model_vocab_size);
    d.scanned = true;
  }
  require_windows(d.train, seq_len);
  if (!d.valid.empty()) require_windows(d.valid, seq_len);
  return d;
}

DatasetShards open_blend(const std::vector<BlendSourcePaths>& sources, int64_t model_vocab_size,
                         int64_t seq_len, bool checksums, const RemoteCacheOptions& cache) {
  DatasetShards all;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    DatasetPaths paths;
    if (s3::is_s3_url(s.path) ||
        std::filesystem::exists(std::filesystem::path(s.path) / "manifest.json")) {
      paths.dataset_dir = s.path;
      if (!s.valid_path.empty()) {
        throw UserError("data.blend[" + std::to_string(i) + "] (" + s.name +
                        "): valid_path is for raw shards; " + s.path +
                        " is a prepare-data directory whose manifest names its valid split");
      }
    } else {
      paths.train_path = s.path;
      paths.valid_path = s.valid_path;
    }
    DatasetShards one;
    try {
      one = open_dataset(paths, model_vocab_size, seq_len, checksums, cache);
    } catch (const UserError& e) {
      throw UserError("data.blend[" + std::to_string(i) + "] (" + s.name + "): " + e.what());
    }
    all.train.insert(all.train.end(), one.train.begin(), one.train.end());
    all.valid.insert(all.valid.end(), one.valid.begin(), one.valid.end());
    all.scanned = all.scanned || one.scanned;
    all.sources.push_back({s.name, s.weight, std::move(one.train), std::move(one.valid)});
  }
  return all;
}

double majority_baseline(const std::vector<ShardInfo>& shards, int64_t seq_len) {
  const int64_t window = seq_len + 1;
  std::unordered_map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (const auto& s : shards) {
    const int64_t windows = s.num_tokens / window;
    const int64_t per_read = std::max<int64_t>(1, kScanChunk / window);
    for (int64_t w = 0; w < windows; w += per_read) {
      const int64_t n = std::min(per_read, windows - w);
      auto t = read_tokens(s, w * window, n * window);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 1; j < window; ++j) {
          const int32_t id = t[static_cast<size_t>(i * window + j)];
          if (id & kNotTargetBit) continue;  // not a target (a prompt token of SFT data)
          ++counts[id];
          ++total;
        }
      }
    }
  }
  int64_t best = 0;
  for (const auto& [tok, c] : counts) best = std::max(best, c);
  return total == 0 ? 0.0 : static_cast<double>(best) / static_cast<double>(total);
}

}  // namespace moe::data
