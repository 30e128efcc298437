// prepare-data --tokenizer hf --tokenizer-file tokenizer.json: BPE as Hugging Face's
// `tokenizers` defines it (GPT-2, Llama-3, Llama-2, Mixtral; not yet the NFC normalizer of
// Qwen2/3 and OLMoE),
// ids identical to that package's
// encode(text, add_special_tokens=False) (tests/data/hf_tokenizer_test.py).
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "moe/data/tokenizer.h"

namespace moe::data {

// One normalizer step: Prepend(from) or Replace(from -> to).
struct HfNormalizerStep {
  bool prepend;
  std::string from, to;
};

class HfBpeTokenizer : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path);  // UserError naming what is unsupported
  std::string name() const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eos_id() const override { return eos_; }
  bool cut_anywhere() const override { return false; }
  size_t last_cut(const std::string& chunk) const override;
  // InvalidUtf8Error for text that is not UTF-8 (the pre-tokenizer's regex works on code
  // points; validated once per call, the regex then skips its own per-match check).
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;

 private:
  struct Regex;
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  void compile_split(const std::string& pattern);
  std::string normalize(std::string text) const;
  void encode_segment(const std::string& raw, std::vector<uint32_t>& out) const;
  void bpe(const std::string& piece, std::vector<uint32_t>& out) const;
  std::vector<uint32_t> merge(const std::string& mapped) const;  // byte-level chars -> ids

  // Pieces already merged, shared by every document and thread (as `tokenizers`' BPE cache):
  // sharded so that threads rarely wait on one another's lock.
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<uint32_t>> ids;
  };
  static constexpr size_t kCacheEntriesPerShard = 1 << 14;  // 1 M pieces in all
  static constexpr size_t kMaxCachedPieceBytes = 256;

  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;
  // (left id << 32 | right id) -> (merge rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  mutable std::array<CacheShard, 64> cache_;
  std::vector<Added> added_;
  std::array<bool, 256> added_first_{};  // bytes an added token starts with
  std::shared_ptr<Regex> regex_;
  std::array<std::string, 256> bytes_;
  bool ignore_merges_ = false, add_prefix_space_ = false, prefix_each_piece_ = false;
  bool byte_level_ = true, byte_fallback_ = false, fuse_unk_ = false;
  int64_t unk_ = -1;
  std::vector<HfNormalizerStep> normalizer_;
  int64_t vocab_size_ = 0, eos_ = -1;
};

}  // namespace moe::data
