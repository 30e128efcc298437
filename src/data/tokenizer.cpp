#include "moe/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "moe/data/hf_bpe_tokenizer.h"
#include "moe/util/errors.h"

namespace moe::data {

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  bool cut_anywhere() const override { return true; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (unsigned char c : text) out.push_back(c);
  }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    auto status = sp_.Load(path);
    if (!status.ok()) {
      throw UserError("tokenizer: " + path +
                      ": cannot load SentencePiece model: " + status.ToString());
    }
  }
  std::string name() const override {
    return "sentencepiece:" + std::filesystem::path(path_).filename().string();
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t eos_id() const override { return sp_.eos_id(); }
  bool cut_anywhere() const override { return false; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!status.ok()) throw UserError("tokenizer: " + path_ + ": " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

size_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07, min = 0x10000;
    if (len == 0 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& model_path) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "sentencepiece") {
    if (model_path.empty()) {
      throw UserError("prepare-data: --tokenizer sentencepiece needs --spm-model FILE");
    }
    return std::make_unique<SentencePieceTokenizer>(model_path);
  }
  if (kind == "hf") {
    if (model_path.empty())
      throw UserError("prepare-data: --tokenizer hf needs --tokenizer-file FILE");
    return std::make_unique<HfBpeTokenizer>(model_path);
  }
  throw UserError("prepare-data: --tokenizer " + kind + ": expected byte, sentencepiece or hf");
}

}  // namespace moe::data
