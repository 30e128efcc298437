// Loader throughput from the page cache: tokens/s that StreamingLoader hands to a consumer that
// does nothing else, for 1 and 2 reader threads, and the same shards as a two-source blend
// (BlendedLoader). Writes its own shards (uint16, random tokens).
//   loader_bench [--tokens N] [--seq-len S] [--batch B] [--dir DIR]
// With --dataset PATH (a prepare-data directory or s3://bucket/prefix): one epoch of that dataset
// with a cold shard cache, then one with it warm (--cache DIR, --cache-max BYTES);
// bench/s3_loader.py compares local files with a local S3 server this way.
//   loader_bench --dataset PATH [--cache DIR] [--cache-max BYTES] [--seq-len S] [--batch B]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "moe/data/blended_loader.h"
#include "moe/data/dataset.h"
#include "moe/data/remote_dataset.h"
#include "moe/data/streaming_loader.h"
#include "moe/data/token_shard.h"

namespace fs = std::filesystem;
using moe::data::LoaderOptions;
using moe::data::StreamingLoader;

// Reads one epoch of `loader`; prints a table row named `label` (none when empty: a warm-up).
void report(const std::string& label, moe::data::BatchStream& loader, int64_t batch, int64_t seq) {
  const int64_t batches = loader.windows_per_epoch() / batch;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t sum = 0;
  for (int64_t b = 0; b < batches; ++b) sum += loader.next().buffer.data[0];
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!label.empty()) {
    std::printf("| %s | %.3g | %lld | %.2f |\n", label.c_str(),
                static_cast<double>(batches * batch * seq) / s, static_cast<long long>(batches), s);
  }
  if (sum < 0) std::printf("impossible\n");
}

// One epoch of a dataset (local or s3://) with a cold cache, then warm; the fetch statistics.
int bench_dataset(const std::string& path, const moe::data::RemoteCacheOptions& cache, int64_t seq,
                  int64_t batch) {
  moe::data::DatasetShards d = moe::data::open_dataset({path, "", ""}, 1 << 30, seq, false, cache);
  LoaderOptions o;
  o.seq_len = seq;
  o.batch_size = batch;
  o.seed = 7;
  o.prefetch = 8;
  o.reader_threads = 2;
  std::printf("| %s | tokens/s | batches | seconds |\n|---|---|---|---|\n", path.c_str());
  for (const char* pass : {"cold cache", "warm cache"}) {
    StreamingLoader loader(d.train, o);
    report(pass, loader, batch, seq);
  }
  if (d.train.front().remote) {
    const auto s = moe::data::remote_cache_stats(*d.train.front().remote);
    std::printf("\nfetched %lld shards, %.1f MiB in %.2f s of fetching; readers waited %.2f s\n",
                static_cast<long long>(s.fetched_shards), double(s.fetched_bytes) / (1 << 20),
                s.fetch_seconds, s.waited_seconds);
  }
  return 0;
}

int main(int argc, char** argv) {
  int64_t total = int64_t(64) << 20, seq = 2048, batch = 8;
  std::string dir = (fs::temp_directory_path() / "moe_loader_bench").string(), dataset;
  moe::data::RemoteCacheOptions cache;
  cache.dir = (fs::temp_directory_path() / "moe_loader_bench_cache").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) total = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seq-len")) seq = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--dataset")) dataset = argv[i + 1];
    if (!std::strcmp(argv[i], "--cache")) cache.dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--cache-max")) cache.max_bytes = std::atoll(argv[i + 1]);
  }
  if (!dataset.empty()) return bench_dataset(dataset, cache, seq, batch);
  const int shards = 4;
  fs::create_directories(dir);
  std::vector<moe::data::ShardInfo> infos;
  std::mt19937 rng(1);
  for (int s = 0; s < shards; ++s) {
    std::string p = dir + "/bench-" + std::to_string(s) + ".h5";
    if (!fs::exists(p) || moe::data::inspect_shard(p).num_tokens != total / shards) {
      std::vector<uint32_t> t(static_cast<size_t>(total / shards));
      for (auto& x : t) x = rng() % 32000;
      moe::data::write_shard(p, t, 32000, "bench");
    }
    infos.push_back(moe::data::inspect_shard(p));
  }
  auto options = [&](int threads) {
    LoaderOptions o;
    o.seq_len = seq;
    o.batch_size = batch;
    o.seed = 7;
    o.prefetch = 8;
    o.reader_threads = threads;
    o.block_windows = 64;
    return o;
  };
  std::printf("| reader threads | tokens/s | batches | seconds |\n|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms the page cache
      StreamingLoader loader(infos, options(threads));
      report(pass == 1 ? std::to_string(threads) : "", loader, batch, seq);
    }
  }
  // The same shards as a blend (data.blend): shards 0-2 weight 0.75, shard 3 weight 0.25, one
  // reader thread per source; the same number of batches.
  std::printf("\n| blend | tokens/s | batches | seconds |\n|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<moe::data::BlendPart> parts = {{{infos[0], infos[1], infos[2]}, 0.75},
                                               {{infos[3]}, 0.25}};
    moe::data::BlendedLoader loader(parts, options(1));
    report(pass == 1 ? "0.75 / 0.25" : "", loader, batch, seq);
  }
  return 0;
}
