#include "moe/data/prepare.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "moe/data/checksum.h"
#include "moe/data/token_shard.h"
#include "moe/data/tokenizer.h"
#include "moe/util/errors.h"

namespace moe::data {

namespace fs = std::filesystem;

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in, ec)) {
        if (e.is_regular_file()) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) throw UserError("prepare-data: " + in + ": directory holds no files");
      files.insert(files.end(), found.begin(), found.end());
    } else {
      glob_t g{};
      int rc = ::glob(in.c_str(), 0, nullptr, &g);
      std::vector<std::string> found;
      if (rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          if (fs::is_regular_file(g.gl_pathv[i], ec)) found.push_back(g.gl_pathv[i]);
        }
      }
      globfree(&g);
      if (found.empty())
        throw UserError("prepare-data: " + in + ": no such file, directory or glob match");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    }
  }
  return files;
}

namespace {

// Accumulates one split's tokens and cuts them into shards; hashing runs asynchronously.
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, int64_t shard_tokens, int64_t vocab,
              std::string tokenizer)
      : dir_(std::move(dir)),
        split_(std::move(split)),
        shard_tokens_(shard_tokens),
        vocab_(vocab),
        tokenizer_(std::move(tokenizer)) {}

  void begin_document() { docs_.push_back(static_cast<int64_t>(buf_.size())); }

  void append(const std::vector<uint32_t>& toks) {
    size_t i = 0;
    while (i < toks.size()) {
      size_t take = std::min(toks.size() - i, static_cast<size_t>(shard_tokens_) - buf_.size());
      buf_.insert(buf_.end(), toks.begin() + static_cast<ptrdiff_t>(i),
                  toks.begin() + static_cast<ptrdiff_t>(i + take));
      i += take;
      if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
    }
  }

  std::vector<ManifestShard> finish() {
    if (!buf_.empty()) flush();
    std::vector<ManifestShard> out;
    for (auto& f : pending_) out.push_back(f.get());
    return out;
  }

 private:
  void flush() {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%05d.h5", split_.c_str(), index_++);
    const std::string path = (fs::path(dir_) / name).string();
    write_shard(path, buf_, vocab_, tokenizer_, docs_);
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
    docs_.clear();
  }

  std::string dir_, split_;
  int64_t shard_tokens_, vocab_;
  std::string tokenizer_;
  int index_ = 0;
  std::vector<uint32_t> buf_;
  std::vector<int64_t> docs_;
  std::vector<std::future<ManifestShard>> pending_;
};

constexpr size_t kChunkBytes = size_t(8) << 20;

// Tokenizes bytes [begin, end) of `path` into `writer` as one document, `threads` chunks at a time.
void tokenize_range(const std::string& path, uint64_t begin, uint64_t end, const Tokenizer& tok,
                    int threads, SplitWriter& writer, uint64_t& done, uint64_t total,
                    const ProgressFn& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("prepare-data: " + path + ": cannot open for reading");
  in.seekg(static_cast<std::streamoff>(begin));
  writer.begin_document();
  std::string carry;
  uint64_t pos = begin;
  while (pos < end || !carry.empty()) {
    std::vector<std::string> chunks;
    while (static_cast<int>(chunks.size()) < threads && pos < end) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, end - pos));
      std::string chunk = std::move(carry);
      carry.clear();
      size_t old = chunk.size();
      chunk.resize(old + n);
      in.read(chunk.data() + old, static_cast<std::streamsize>(n));
      if (static_cast<size_t>(in.gcount()) != n) {
        throw UserError("prepare-data: " + path + ": short read at offset " + std::to_string(pos));
      }
      pos += n;
      if (!tok.cut_anywhere() && pos < end) {
        // SentencePiece sees whole lines: keep the tail after the last newline for the next chunk.
        size_t nl = chunk.rfind('\n');
        if (nl != std::string::npos) {
          carry = chunk.substr(nl + 1);
          chunk.resize(nl + 1);
        }
      }
      chunks.push_back(std::move(chunk));
    }
    if (chunks.empty()) {
      chunks.push_back(std::move(carry));
      carry.clear();
    }
    std::vector<std::future<std::vector<uint32_t>>> parts;
    for (auto& c : chunks) {
      parts.push_back(std::async(std::launch::async, [&tok, &c] {
        std::vector<uint32_t> ids;
        tok.encode(c, ids);
        return ids;
      }));
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      writer.append(parts[i].get());
      done += chunks[i].size();
    }
    if (progress) progress(std::min(done, total), total);
  }
}

// Where the validation tail of a file starts: byte-exact for the byte tokenizer, else at the
// start of the line that holds the cut.
uint64_t valid_cut(const std::string& path, uint64_t size, double fraction, bool anywhere) {
  uint64_t cut = size - static_cast<uint64_t>(static_cast<double>(size) * fraction);
  if (anywhere || cut == 0 || cut >= size) return cut;
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(cut));
  char c;
  while (cut < size && in.get(c) && c != '\n') ++cut;
  return std::min(size, cut + 1);
}

}  // namespace

Manifest prepare_data(const PrepareOptions& opt, const ProgressFn& progress) {
  if (opt.out_dir.empty()) throw UserError("prepare-data: --out DIR is required");
  if (opt.valid_fraction < 0 || opt.valid_fraction >= 1) {
    throw UserError("prepare-data: --valid-fraction " + std::to_string(opt.valid_fraction) +
                    ": expected a value in [0, 1)");
  }
  if (opt.valid_fraction > 0 && !opt.valid_inputs.empty()) {
    throw UserError("prepare-data: use --valid-fraction or --valid-input, not both");
  }
  if (opt.shard_tokens < 1) throw UserError("prepare-data: --shard-tokens must be >= 1");
  auto tok = make_tokenizer(opt.tokenizer, opt.spm_model);
  const auto train_files = expand_inputs(opt.inputs);
  const auto valid_files =
      opt.valid_inputs.empty() ? std::vector<std::string>{} : expand_inputs(opt.valid_inputs);
  std::error_code ec;
  if (fs::exists(opt.out_dir, ec) && !fs::is_empty(opt.out_dir, ec)) {
    throw UserError("prepare-data: " + opt.out_dir +
                    ": exists and is not empty; choose a new directory (nothing was written)");
  }
  fs::create_directories(opt.out_dir, ec);
  if (ec) throw UserError("prepare-data: " + opt.out_dir + ": cannot create: " + ec.message());

  uint64_t total = 0, done = 0;
  for (const auto* list : {&train_files, &valid_files}) {
    for (const auto& f : *list) total += fs::file_size(f);
  }
  const int threads = std::max(1, opt.threads);
  SplitWriter train(opt.out_dir, "train", opt.shard_tokens, tok->vocab_size(), tok->name());
  SplitWriter valid(opt.out_dir, "valid", opt.shard_tokens, tok->vocab_size(), tok->name());
  bool any_valid = !valid_files.empty();
  for (const auto& f : train_files) {
    const uint64_t size = fs::file_size(f);
    const uint64_t cut =
        opt.valid_fraction > 0 ? valid_cut(f, size, opt.valid_fraction, tok->cut_anywhere()) : size;
    tokenize_range(f, 0, cut, *tok, threads, train, done, total, progress);
    if (cut < size) {
      tokenize_range(f, cut, size, *tok, threads, valid, done, total, progress);
      any_valid = true;
    }
  }
  for (const auto& f : valid_files) {
    tokenize_range(f, 0, fs::file_size(f), *tok, threads, valid, done, total, progress);
  }
  Manifest m;
  m.vocab_size = tok->vocab_size();
  m.tokenizer = tok->name();
  m.splits["train"] = train.finish();
  if (any_valid) m.splits["valid"] = valid.finish();
  save_manifest(opt.out_dir, m);
  return m;
}

}  // namespace moe::data
