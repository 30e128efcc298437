#include "moe/tokenizers/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "moe/tokenizers/hf_bpe_tokenizer.h"
#include "moe/util/errors.h"

namespace moe::tokenizers {

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
  std::string decode(const std::vector<int64_t>& ids, bool) const override {
    std::string out;
    for (int64_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    replace_invalid_utf8(out);
    return out;
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
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override {
    std::vector<int> kept;
    for (int64_t id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize()) continue;
      const int i = static_cast<int>(id);
      if (skip_special && (sp_.IsControl(i) || sp_.IsUnknown(i))) continue;
      kept.push_back(i);
    }
    std::string text;
    auto status = sp_.Decode(kept, &text);
    if (!status.ok()) throw UserError("tokenizer: " + path_ + ": " + status.ToString());
    return text;
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

size_t replace_invalid_utf8(std::string& text) {
  if (first_invalid_utf8(text) == std::string_view::npos) return 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  out.reserve(n + 16);
  size_t replaced = 0;
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Continuation bytes a lead byte needs, and the range its first one must lie in (Unicode's
    // table 3-7: no overlong forms, surrogates or code points above U+10FFFF).
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    }
    size_t k = 1;  // the lead byte and the continuation bytes that fit: the maximal subpart
    while (k <= need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) &&
           s[i + k] <= (k == 1 ? hi : 0xBF)) {
      ++k;
    }
    if (need > 0 && k == need + 1) {
      out.append(text, i, k);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart (or the lone bad byte)
      ++replaced;
    }
    i += k;
  }
  text = std::move(out);
  return replaced;
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

}  // namespace moe::tokenizers
