// A tokenizer.json "normalizer" as Hugging Face's `tokenizers` applies it to each segment of text
// between added tokens: NFC, NFD, NFKC, NFKD (ICU, held at the Unicode version `tokenizers`'
// tables have), Prepend, Replace (of a string), Lowercase, Strip, and Sequence of these; null is
// none. Anything else is refused by name.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::tokenizers {

class HfNormalizer {
 public:
  using Refuse = std::function<void(const std::string&)>;  // throws, naming what is unsupported

  HfNormalizer() = default;
  HfNormalizer(const nlohmann::json& spec, const Refuse& refuse);

  bool empty() const { return steps_.empty(); }
  // True when the result at the ends of a text depends on where the text ends (Prepend, Strip):
  // such text must not be cut into chunks.
  bool depends_on_ends() const;
  std::string apply(std::string text) const;

 private:
  struct Step {
    enum Kind { kUnicodeForm, kPrepend, kReplace, kLowercase, kStrip } kind;
    std::string from, to;              // Prepend: from; Replace: from -> to
    bool left = false, right = false;  // Strip
    const void* form = nullptr;        // kUnicodeForm: the ICU Normalizer2
  };
  std::vector<Step> steps_;
};

}  // namespace moe::tokenizers
