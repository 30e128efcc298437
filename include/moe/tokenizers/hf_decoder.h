// A tokenizer.json "decoder" as Hugging Face's `tokenizers` applies it to the tokens of a decode:
// ByteLevel (GPT-2, Qwen, OLMoE, DeepSeek-V3, gpt-oss), Replace, ByteFallback, Fuse, Strip
// (Llama-2, Mixtral), Metaspace, and Sequence of these; null joins the tokens with spaces as the
// package does. Anything else is named by unsupported(), so that only a decode refuses it.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::tokenizers {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n, as UTF-8
// (what the ByteLevel pre-tokenizer writes and its decoder reads back).
std::array<std::string, 256> gpt2_byte_to_unicode();

class HfDecoder {
 public:
  HfDecoder() = default;
  explicit HfDecoder(const nlohmann::json& spec);

  // "" when every step is understood; else the first that is not ("decoder type X").
  const std::string& unsupported() const { return unsupported_; }
  // The text of `tokens` (vocabulary strings), invalid UTF-8 replaced by U+FFFD.
  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::string from, to;            // Replace; Strip's content; Metaspace's replacement
    size_t start = 0, stop = 0;      // Strip
    bool strip_first_space = false;  // Metaspace: the prepended space of the first token
  };
  void add(const nlohmann::json& spec);
  std::vector<Step> steps_;
  bool none_ = true;  // no decoder: tokens joined with " "
  std::string unsupported_;
};

}  // namespace moe::tokenizers
