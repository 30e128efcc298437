#include "moe/data/token_dataset.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <unordered_map>

#include "moe/data/token_shard.h"
#include "moe/util/errors.h"

namespace moe::data {

TokenDataset::TokenDataset(const std::string& path, int64_t vocab_size, int64_t seq_len)
    : window_(seq_len + 1) {
  for (const auto& shard_path : list_shards(path)) {
    ShardInfo info = inspect_shard(shard_path);
    if (info.vocab_size > vocab_size) {
      throw UserError("data: " + shard_path + ": shard vocab_size " +
                      std::to_string(info.vocab_size) + " exceeds model.vocab_size " +
                      std::to_string(vocab_size));
    }
    auto t = read_tokens(info, 0, info.num_tokens);
    tokens_.insert(tokens_.end(), t.begin(), t.end());
  }
  num_windows_ = static_cast<int64_t>(tokens_.size()) / window_;
  if (num_windows_ == 0) {
    throw UserError("data: " + path + ": holds " + std::to_string(tokens_.size()) +
                    " tokens; one training window needs seq_len + 1 = " + std::to_string(window_));
  }
}

void TokenDataset::copy_window(int64_t w, int64_t* out) const {
  const int32_t* src = tokens_.data() + w * window_;
  std::copy(src, src + window_, out);
}

double TokenDataset::majority_baseline() const {
  std::unordered_map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (int64_t w = 0; w < num_windows_; ++w) {
    for (int64_t i = 1; i < window_; ++i) {
      ++counts[tokens_[static_cast<size_t>(w * window_ + i)]];
      ++total;
    }
  }
  int64_t best = 0;
  for (const auto& [tok, c] : counts) best = std::max(best, c);
  return total == 0 ? 0.0 : static_cast<double>(best) / static_cast<double>(total);
}

WindowSampler::WindowSampler(int64_t num_windows, uint64_t seed, bool shuffle)
    : num_windows_(num_windows), seed_(seed), shuffle_(shuffle) {
  reshuffle();
}

void WindowSampler::reshuffle() {
  order_.resize(static_cast<size_t>(num_windows_));
  std::iota(order_.begin(), order_.end(), 0);
  if (shuffle_) {
    // One generator per epoch, seeded from (seed, epoch): resuming needs only the state.
    std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(state_.epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
}

int64_t WindowSampler::next() {
  if (state_.position >= num_windows_) {
    ++state_.epoch;
    state_.position = 0;
    reshuffle();
  }
  return order_[static_cast<size_t>(state_.position++)];
}

}  // namespace moe::data
