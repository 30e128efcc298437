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
