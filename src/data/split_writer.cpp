#include "moe/data/split_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "moe/data/checksum.h"
#include "moe/data/token_shard.h"

namespace moe::data {

namespace fs = std::filesystem;

SplitWriter::SplitWriter(std::string dir, std::string split, int64_t shard_tokens, int64_t vocab,
                         std::string tokenizer, bool loss_mask)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      shard_tokens_(shard_tokens),
      vocab_(vocab),
      tokenizer_(std::move(tokenizer)),
      masked_(loss_mask) {}

void SplitWriter::append(const std::vector<uint32_t>& toks, const std::vector<uint8_t>* mask) {
  size_t i = 0;
  while (i < toks.size()) {
    size_t take = std::min(toks.size() - i, static_cast<size_t>(shard_tokens_) - buf_.size());
    buf_.insert(buf_.end(), toks.begin() + static_cast<ptrdiff_t>(i),
                toks.begin() + static_cast<ptrdiff_t>(i + take));
    if (masked_ && mask != nullptr) {
      mask_.insert(mask_.end(), mask->begin() + static_cast<ptrdiff_t>(i),
                   mask->begin() + static_cast<ptrdiff_t>(i + take));
    } else if (masked_) {
      mask_.insert(mask_.end(), take, 1);
    }
    i += take;
    if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
  }
}

std::vector<ManifestShard> SplitWriter::finish() {
  if (!buf_.empty()) flush();
  std::vector<ManifestShard> out;
  for (auto& f : pending_) out.push_back(f.get());
  return out;
}

void SplitWriter::flush() {
  char name[64];
  std::snprintf(name, sizeof name, "%s-%05d.h5", split_.c_str(), index_++);
  const std::string path = (fs::path(dir_) / name).string();
  write_shard(path, buf_, vocab_, tokenizer_, docs_, mask_);
  ManifestShard s;
  s.file = name;
  s.tokens = static_cast<int64_t>(buf_.size());
  s.max_token = buf_.empty() ? -1 : *std::max_element(buf_.begin(), buf_.end());
  s.documents = static_cast<int64_t>(docs_.size());
  // Hash on another thread while the next shard is tokenized.
  pending_.push_back(std::async(std::launch::async, [s, path]() mutable {
    FileDigest d = digest_file(path);
    s.bytes = static_cast<int64_t>(d.bytes);
    s.md5 = d.md5;
    s.xxh3 = d.xxh3;
    return s;
  }));
  buf_.clear();
  mask_.clear();
  docs_.clear();
}

}  // namespace moe::data
