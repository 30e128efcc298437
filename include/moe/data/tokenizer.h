// Tokenizers for prepare-data: byte-level (vocabulary 256, no files needed) and SentencePiece
// models (Debian's libsentencepiece).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moe::data {

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
  // starts at (after the last newline), npos for none.
  virtual size_t last_cut(const std::string& chunk) const {
    const size_t nl = chunk.rfind('\n');
    return nl == std::string::npos ? nl : nl + 1;
  }
  // The end-of-sequence id, -1 when the vocabulary has none (bytes).
  virtual int64_t eos_id() const { return -1; }
};

// kind: "byte" | "sentencepiece" | "hf" (model_path: the .model or tokenizer.json file).
// Throws UserError on a bad model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& model_path);

}  // namespace moe::data
