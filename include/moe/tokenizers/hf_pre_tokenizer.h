// A tokenizer.json "pre_tokenizer" as Hugging Face's `tokenizers` applies it to each normalized
// segment: Split (a regex, PCRE2 with Unicode properties standing in for Oniguruma, or a
// string; every split behavior, invert), ByteLevel (its GPT-2 regex and add_prefix_space; the
// byte-to-unicode mapping itself is the BPE model's job here), Digits, Metaspace, Punctuation,
// WhitespaceSplit, and Sequence of these; null is none (the segment is one piece).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::tokenizers {

class HfPreTokenizer {
 public:
  using Refuse = std::function<void(const std::string&)>;  // throws, naming what is unsupported

  HfPreTokenizer() = default;
  // `origin`: the tokenizer.json path, named when a pattern hits PCRE2's limits on some text.
  HfPreTokenizer(const nlohmann::json& spec, const Refuse& refuse, const std::string& origin = "");
  ~HfPreTokenizer();

  bool empty() const { return steps_.empty(); }
  // The pieces are byte-level: the BPE model maps their bytes to GPT-2's unicode characters.
  bool byte_level() const { return byte_level_; }
  // True when a piece may gain a prefix at the start of a segment (Metaspace's replacement,
  // ByteLevel's space on a whole segment): a text cut into chunks would gain it at every cut.
  bool prefixes_segments() const { return prefixes_segments_; }
  // Appends the pieces of `segment` to `pieces`. `at_text_start`: the segment starts the text
  // (Metaspace's prepend_scheme "first" prepends there only).
  void split(const std::string& segment, bool at_text_start,
             std::vector<std::string>& pieces) const;

  struct Step;

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
  bool byte_level_ = false, prefixes_segments_ = false;
};

}  // namespace moe::tokenizers
