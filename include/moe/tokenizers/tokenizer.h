// Tokenizers for prepare-data: byte-level (vocabulary 256, no files needed) and SentencePiece
// models (Debian's libsentencepiece).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace moe::tokenizers {

// Text that is not valid UTF-8 where a tokenizer needs it: `offset` is the first bad byte within
// the text given to encode() (prepare-data adds the file and the text's own offset).
class InvalidUtf8Error : public std::runtime_error {
 public:
  explicit InvalidUtf8Error(size_t offset)
      : std::runtime_error("invalid UTF-8 at byte " + std::to_string(offset)), offset(offset) {}
  size_t offset;
};

// The byte offset of the first invalid UTF-8 sequence of `text`, npos when it is valid
// (overlong forms, surrogates and code points above U+10FFFF are invalid, as in Python).
size_t first_invalid_utf8(std::string_view text);

// `text` with every invalid UTF-8 sequence replaced by U+FFFD as Python's
// bytes.decode(errors="replace") does (one per maximal subpart of a valid sequence); returns
// how many were replaced.
size_t replace_invalid_utf8(std::string& text);

// What the tokenizer's post-processor puts around one sequence (Hugging Face's
// TemplateProcessing, e.g. Llama's BOS), for prepare-data --add-special-tokens.
struct SpecialTokens {
  std::vector<uint32_t> before, after;
  // Empty when understood (or there is no post-processor); else what is not, for the error.
  std::string unsupported = "a tokenizer without a Hugging Face post-processor";
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Appends the ids of `text` to `out`. Thread-safe (const).
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // True when any byte boundary is a valid cut (bytes); false when cuts must fall on newlines.
  virtual bool cut_anywhere() const = 0;
  // Where a chunk of text may be cut when cut_anywhere() is false: the offset the next chunk
  // starts at (after the last newline), npos for none; 0: never cut this text (a tokenizer
  // whose pieces may span anything: the document is tokenized whole).
  virtual size_t last_cut(const std::string& chunk) const {
    const size_t nl = chunk.rfind('\n');
    return nl == std::string::npos ? nl : nl + 1;
  }
  // The end-of-sequence id, -1 when the vocabulary has none (bytes).
  virtual int64_t eos_id() const { return -1; }
  virtual SpecialTokens special_tokens() const { return {}; }
  // The texts of its special tokens (for SFT masks: a chat turn ends at one).
  virtual std::vector<std::string> special_token_texts() const { return {}; }
  // The text of `ids` as the Hugging Face / SentencePiece decode writes it, special tokens left
  // out when `skip_special`; invalid UTF-8 (a character cut between ids) as U+FFFD. UserError
  // when the tokenizer cannot decode (a decoder it does not know), naming it.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special) const = 0;
};

// kind: "byte" | "sentencepiece" | "hf" (model_path: the .model or tokenizer.json file).
// Throws UserError on a bad model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& model_path);

}  // namespace moe::tokenizers
