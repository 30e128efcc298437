// In-memory token dataset over HDF5 shards, cut into non-overlapping windows of seq_len + 1
// tokens (inputs and shifted targets), visited in a seeded random order per epoch.
// The streaming loader (background prefetch, bounded memory) replaces the in-memory part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::data {

struct LoaderState {  // small and exact: enough to resume the same batch sequence
  int64_t epoch = 0;
  int64_t position = 0;  // windows consumed in this epoch
};

class TokenDataset {
 public:
  // Loads and checks every shard under `path` against the model's vocabulary.
  TokenDataset(const std::string& path, int64_t vocab_size, int64_t seq_len);

  int64_t num_windows() const { return num_windows_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t window_len() const { return window_; }
  // Copies window `w` (seq_len + 1 tokens) into `out`.
  void copy_window(int64_t w, int64_t* out) const;
  // Share of targets equal to the most frequent target token: the majority-class baseline.
  double majority_baseline() const;

 private:
  std::vector<int32_t> tokens_;
  int64_t window_;
  int64_t num_windows_;
};

// Seeded epoch-shuffled sampler of window indices.
class WindowSampler {
 public:
  WindowSampler(int64_t num_windows, uint64_t seed, bool shuffle);
  int64_t next();  // crosses epoch boundaries seamlessly
  const LoaderState& state() const { return state_; }

 private:
  void reshuffle();
  int64_t num_windows_;
  uint64_t seed_;
  bool shuffle_;
  LoaderState state_;
  std::vector<int64_t> order_;
};

}  // namespace moe::data
