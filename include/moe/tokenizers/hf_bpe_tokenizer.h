// prepare-data --tokenizer hf --tokenizer-file tokenizer.json: a BPE tokenizer as Hugging Face's
// `tokenizers` runs it (GPT-2, Llama-3, Qwen2/Qwen3, OLMoE, DeepSeek-V3, Llama-2, Mixtral): added
// tokens split out, the normalizer (hf_normalizer.h), the pre-tokenizer (hf_pre_tokenizer.h), then
// the BPE model; the post-processor's special tokens when asked. ids identical to that package's
// encode(text, add_special_tokens=...) (tests/tokenizers/hf_tokenizer_test.py).
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "moe/tokenizers/hf_decoder.h"
#include "moe/tokenizers/hf_normalizer.h"
#include "moe/tokenizers/hf_pre_tokenizer.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::tokenizers {

class HfBpeTokenizer : public Tokenizer {
 public:
  explicit HfBpeTokenizer(const std::string& path);  // UserError naming what is unsupported
  std::string name() const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eos_id() const override { return eos_; }
  bool cut_anywhere() const override { return false; }
  size_t last_cut(const std::string& chunk) const override;
  // InvalidUtf8Error for text that is not UTF-8 (validated once per call; the regexes then skip
  // their own per-match check).
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  SpecialTokens special_tokens() const override { return special_; }
  std::vector<std::string> special_token_texts() const override { return special_texts_; }
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;

 private:
  struct Added {
    std::string content;
    int64_t id;
  };
  // Leftmost-longest matches of `tokens` in `text`: the segments between them go to `segment`,
  // each match's id to `out` (tokenizers' AddedVocabulary).
  void split_added(const std::string& text, const std::vector<Added>& tokens,
                   const std::array<bool, 256>& first_bytes, std::vector<uint32_t>& out,
                   const std::function<void(const std::string&, size_t)>& segment) const;
  void encode_segment(const std::string& raw, bool at_text_start, std::vector<uint32_t>& out) const;
  void bpe(const std::string& piece, std::vector<uint32_t>& out) const;
  std::vector<uint32_t> merge_word(const std::string& mapped) const;
  int64_t symbol_id(std::string_view symbol) const;  // -1 when not in the vocabulary
  void name_id(const std::string& token, int64_t id, bool special);  // for decode

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
  std::unordered_map<uint32_t, int64_t> char_ids_;  // one-code-point vocabulary entries
  // (left id << 32 | right id) -> (merge rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  mutable std::array<CacheShard, 64> cache_;
  // Added tokens matched in the raw text, and those (normalized: true) matched after the
  // normalizer; longest first.
  std::vector<Added> raw_added_, normalized_added_;
  std::array<bool, 256> raw_added_first_{}, normalized_added_first_{};
  HfNormalizer normalizer_;
  HfPreTokenizer pre_tokenizer_;
  std::array<std::string, 256> bytes_;
  bool ignore_merges_ = false, byte_fallback_ = false, fuse_unk_ = false;
  std::string subword_prefix_, word_suffix_;
  int64_t unk_ = -1;
  SpecialTokens special_;
  std::vector<std::string> special_texts_;
  int64_t vocab_size_ = 0, eos_ = -1;
  std::vector<std::string> id_tokens_;  // id -> its vocabulary string (added tokens' content)
  std::vector<bool> special_ids_;       // id -> an added token marked special
  HfDecoder decoder_;
};

}  // namespace moe::tokenizers
