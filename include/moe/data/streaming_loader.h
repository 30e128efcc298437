// Streaming loader: background reader threads read contiguous hyperslabs ("blocks" of windows)
// from the shards, an assembler thread cuts windows of seq_len + 1 tokens, shuffles them, fills
// batch buffers (pinned host memory when the caller supplies such a factory) and hands them over
// a bounded queue. Memory is bounded by (prefetch batches + blocks in flight), whatever the
// dataset size. The order is a pure function of (seed, epoch), so a LoaderState resumes exactly.
//
// Order of one epoch: the list of blocks of all shards (block_windows windows each, the last
// block of a shard shorter) is shuffled with a generator seeded by (seed, epoch); inside each
// block the windows are shuffled with a generator seeded by (seed, epoch, block). With
// shuffle = false both orders are natural (shard by shard, window by window).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moe/data/dataset.h"
#include "moe/data/token_shard.h"

namespace moe::data {

struct LoaderOptions {
  int64_t seq_len = 0;     // windows hold seq_len + 1 tokens
  int64_t batch_size = 1;  // windows per batch
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t prefetch = 4;         // batches ready ahead of the consumer
  int reader_threads = 1;       // concurrent block readers
  int64_t block_windows = 256;  // windows per contiguous read
};

// Where batch memory comes from; the default allocates plain host memory.
struct BatchBuffer {
  int64_t* data = nullptr;
  std::shared_ptr<void> owner;  // keeps `data` alive (e.g. a pinned torch::Tensor)
};
using BufferFactory = std::function<BatchBuffer(int64_t num_tokens)>;
// A buffer of `num_tokens` from `factory`, or plain host memory when it is empty.
BatchBuffer make_buffer(const BufferFactory& factory, int64_t num_tokens);

struct Batch {
  BatchBuffer buffer;  // rows x cols int64 tokens, row-major
  int64_t rows = 0, cols = 0;
  LoaderState state_after;  // resume here to get the batch after this one
};

// What the trainer pulls batches from: one dataset (StreamingLoader) or a weighted blend of
// several (BlendedLoader, blended_loader.h).
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  // The next batch (blocks until ready); reader errors are rethrown as the UserError they were.
  virtual Batch next() = 0;
  // Seconds next() spent waiting for data, summed since construction.
  virtual double wait_seconds() const = 0;
  // Windows in one epoch (for a blend: all sources' windows together).
  virtual int64_t windows_per_epoch() const = 0;
  // Of a blend: per source, the passes over it begun so far (1 until it wraps around); empty
  // for one dataset.
  virtual std::vector<int64_t> source_passes() const { return {}; }
};

class StreamingLoader : public BatchStream {
 public:
  StreamingLoader(std::vector<ShardInfo> shards, LoaderOptions opt, LoaderState start = {},
                  BufferFactory factory = {});
  ~StreamingLoader();
  StreamingLoader(const StreamingLoader&) = delete;
  StreamingLoader& operator=(const StreamingLoader&) = delete;

  // The next batch (blocks until ready). Errors from the reader threads (a damaged shard,
  // an out-of-range token) are rethrown here as the UserError they were.
  Batch next() override;
  int64_t windows_per_epoch() const override;
  double wait_seconds() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Checks a set of shards for a loader: each must hold at least one window.
void require_windows(const std::vector<ShardInfo>& shards, int64_t seq_len);

}  // namespace moe::data
