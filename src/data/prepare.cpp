#include "moe/data/prepare.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>

#include "moe/chat/sft.h"
#include "moe/data/checksum.h"
#include "moe/data/line_reader.h"
#include "moe/data/split_writer.h"
#include "moe/data/token_shard.h"
#include "moe/tokenizers/tokenizer.h"
#include "moe/util/errors.h"
#include "moe/util/staged_dir.h"

#include <nlohmann/json.hpp>

namespace moe::data {

namespace fs = std::filesystem;
using chat::load_chat_setup;
using chat::SftEncoder;
using chat::SftExample;
using tokenizers::InvalidUtf8Error;
using tokenizers::make_tokenizer;
using tokenizers::replace_invalid_utf8;
using tokenizers::SpecialTokens;
using tokenizers::Tokenizer;

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

constexpr size_t kChunkBytes = size_t(8) << 20;

// How a document's text becomes ids: invalid UTF-8 replaced when asked (and counted), the
// tokenizer's special tokens around it when asked, the end-of-document token after it.
struct DocumentEncoder {
  DocumentEncoder(const Tokenizer& t, bool replace, int64_t eod_id)
      : tok(t), replace_invalid(replace), eod(eod_id) {}
  const Tokenizer& tok;
  SpecialTokens special;  // empty unless --add-special-tokens
  bool replace_invalid = false;
  int64_t eod = -1;
  mutable std::atomic<int64_t> replaced{0};

  void encode(std::string text, std::vector<uint32_t>& out) const {
    if (replace_invalid) replaced += static_cast<int64_t>(replace_invalid_utf8(text));
    tok.encode(text, out);
  }
  void begin(std::vector<uint32_t>& out) const {
    out.insert(out.end(), special.before.begin(), special.before.end());
  }
  void end(std::vector<uint32_t>& out) const {
    out.insert(out.end(), special.after.begin(), special.after.end());
    // A template that already ends the document with the end-of-document token keeps one.
    const bool ended = !special.after.empty() && static_cast<int64_t>(special.after.back()) == eod;
    if (eod >= 0 && !ended) out.push_back(static_cast<uint32_t>(eod));
  }
};

// Tokenizes bytes [begin, end) of `path` into `writer` as one document, `threads` chunks at a time.
void tokenize_range(const std::string& path, uint64_t begin, uint64_t end,
                    const DocumentEncoder& enc, int threads, SplitWriter& writer, uint64_t& done,
                    uint64_t total, const ProgressFn& progress) {
  const Tokenizer& tok = enc.tok;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("prepare-data: " + path + ": cannot open for reading");
  in.seekg(static_cast<std::streamoff>(begin));
  writer.begin_document();
  std::vector<uint32_t> around;
  enc.begin(around);
  writer.append(around);
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
        // SentencePiece and BPE see whole lines: the tail after the tokenizer's last safe cut
        // goes to the next chunk.
        // No safe cut yet (npos), or never (0): read on; a chunk is never cut blindly.
        const size_t cut = tok.last_cut(chunk);
        if (cut == 0 || cut == std::string::npos) {
          carry = std::move(chunk);
          continue;
        }
        carry = chunk.substr(cut);
        chunk.resize(cut);
      }
      chunks.push_back(std::move(chunk));
    }
    if (chunks.empty()) {
      chunks.push_back(std::move(carry));
      carry.clear();
    }
    std::vector<std::future<std::vector<uint32_t>>> parts;
    for (auto& c : chunks) {
      parts.push_back(std::async(std::launch::async, [&enc, &c] {
        std::vector<uint32_t> ids;
        enc.encode(c, ids);
        return ids;
      }));
    }
    uint64_t chunk_start = pos - carry.size();
    for (const auto& c : chunks) chunk_start -= c.size();  // file offset of chunks[0]
    for (size_t i = 0; i < parts.size(); ++i) {
      try {
        writer.append(parts[i].get());
      } catch (const InvalidUtf8Error& e) {
        for (size_t j = i + 1; j < parts.size(); ++j) parts[j].wait();
        throw UserError("prepare-data: " + path + ": invalid UTF-8 at byte offset " +
                        std::to_string(chunk_start + e.offset) + " (the " + tok.name() +
                        " tokenizer needs UTF-8 text; nothing was written)");
      }
      chunk_start += chunks[i].size();
      done += chunks[i].size();
    }
    if (progress) progress(std::min(done, total), total);
  }
  around.clear();
  enc.end(around);
  writer.append(around);
}

bool is_jsonl(const std::string& path, bool all_jsonl) {
  return all_jsonl || path.ends_with(".jsonl") || path.ends_with(".jsonl.gz") ||
         path.ends_with(".jsonl.zst");
}

// The text of one JSONL line, or nullopt with `why` set when the line is malformed.
std::optional<std::string> jsonl_text(const std::string& line, const std::string& key,
                                      std::string& why) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    why = std::string("invalid JSON: ") + e.what();
    return std::nullopt;
  }
  if (!j.is_object()) {
    why = "expected a JSON object";
  } else if (!j.contains(key)) {
    why = "no \"" + key + "\" key";
  } else if (!j[key].is_string()) {
    why = "\"" + key + "\" is not a string";
  } else {
    return j[key].get<std::string>();
  }
  return std::nullopt;
}

// Where JSONL examples go: with a validation fraction F, example i of the file goes to
// validation when floor((i + 1) F) > floor(i F): an even 1-in-1/F spread, streaming.
struct JsonlSplits {
  SplitWriter& train;
  SplitWriter* valid;  // null: no validation fraction
  double fraction;
};

// The lines of a JSONL file: each parsed on this thread (`parse(line, why)`: the item, or nullopt
// with `why`: a malformed line stops the command naming file:line, or with --skip-bad-lines is
// skipped and counted), encoded `threads` batches at a time (`encode(item, line_number)` ->
// SftExample; order kept) and written to its split. Returns the lines skipped.
template <class Item, class Parse, class Encode>
int64_t tokenize_jsonl_lines(const std::string& path, const PrepareOptions& opt,
                             const DocumentEncoder& enc, JsonlSplits out, uint64_t& done,
                             uint64_t total, const ProgressFn& progress, const Parse& parse,
                             const Encode& encode) {
  LineReader reader(path);
  const uint64_t start = done;
  int64_t skipped = 0, doc = 0;
  struct Pending {
    Item item;
    bool valid;
    int64_t line;
  };
  std::vector<Pending> batch;
  size_t batch_bytes = 0;
  auto flush = [&] {
    const size_t threads = static_cast<size_t>(std::max(1, opt.threads));
    const size_t per = (batch.size() + threads - 1) / threads;
    std::vector<std::future<std::vector<SftExample>>> parts;
    for (size_t b = 0; b < batch.size(); b += per) {
      parts.push_back(std::async(std::launch::async, [&, b] {
        std::vector<SftExample> encoded;
        for (size_t i = b; i < std::min(batch.size(), b + per); ++i) {
          encoded.push_back(encode(std::move(batch[i].item), batch[i].line));
        }
        return encoded;
      }));
    }
    size_t i = 0;
    for (auto& p : parts) {
      for (auto& ex : p.get()) {
        SplitWriter& w = batch[i++].valid ? *out.valid : out.train;
        w.begin_document();
        w.append(ex.ids, ex.mask.empty() ? nullptr : &ex.mask);
      }
    }
    batch.clear();
    batch_bytes = 0;
  };
  std::string line, why;
  while (reader.next(line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    // As Python reading the file with errors="replace" before json.loads.
    if (enc.replace_invalid) enc.replaced += static_cast<int64_t>(replace_invalid_utf8(line));
    std::optional<Item> item = parse(line, why);
    if (!item) {
      if (!opt.skip_bad_lines) {
        throw UserError("prepare-data: " + path + ":" + std::to_string(reader.line_number()) +
                        ": " + why + " (--skip-bad-lines skips such lines; nothing was written)");
      }
      ++skipped;
      continue;
    }
    const bool valid =
        out.valid != nullptr && std::floor(static_cast<double>(doc + 1) * out.fraction) >
                                    std::floor(static_cast<double>(doc) * out.fraction);
    ++doc;
    batch_bytes += line.size();
    batch.push_back({std::move(*item), valid, static_cast<int64_t>(reader.line_number())});
    if (batch_bytes >= kChunkBytes * static_cast<size_t>(std::max(1, opt.threads))) {
      flush();
      done = start + reader.bytes_read();
      if (progress) progress(std::min(done, total), total);
    }
  }
  flush();
  done = start + reader.bytes_read();
  if (progress) progress(std::min(done, total), total);
  return skipped;
}

// Documents of a JSONL file (their text under --jsonl-key), each followed by the
// end-of-document token when asked.
int64_t tokenize_jsonl(const std::string& path, const PrepareOptions& opt,
                       const DocumentEncoder& enc, JsonlSplits out, uint64_t& done, uint64_t total,
                       const ProgressFn& progress) {
  return tokenize_jsonl_lines<std::string>(
      path, opt, enc, out, done, total, progress,
      [&](const std::string& line, std::string& why) {
        return jsonl_text(line, opt.jsonl_key, why);
      },
      [&](std::string text, int64_t /*line*/) {
        SftExample ex;
        enc.begin(ex.ids);
        enc.encode(std::move(text), ex.ids);
        enc.end(ex.ids);
        return ex;
      });
}

// SFT examples of a JSONL file (prepare-data --format sft), each followed by the
// end-of-document token (not a target) when asked; counts the targets.
int64_t tokenize_sft(const std::string& path, const PrepareOptions& opt, const DocumentEncoder& enc,
                     const SftEncoder& sft, JsonlSplits out, uint64_t& done, uint64_t total,
                     const ProgressFn& progress, std::atomic<int64_t>& targets) {
  return tokenize_jsonl_lines<nlohmann::ordered_json>(
      path, opt, enc, out, done, total, progress, &SftEncoder::parse,
      [&](const nlohmann::ordered_json& example, int64_t line) {
        SftExample ex;
        try {
          ex = sft.encode(example);
        } catch (const UserError& e) {
          throw UserError("prepare-data: " + path + ":" + std::to_string(line) + ": " + e.what() +
                          " (nothing was written)");
        }
        if (enc.eod >= 0 && (ex.ids.empty() || ex.ids.back() != static_cast<uint32_t>(enc.eod))) {
          ex.ids.push_back(static_cast<uint32_t>(enc.eod));
          ex.mask.push_back(0);
        }
        targets += std::count(ex.mask.begin(), ex.mask.end(), uint8_t{1});
        return ex;
      });
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

// The tokenizer kind and its file: as given, or found in --tokenizer-from DIR.
static std::pair<std::string, std::string> tokenizer_choice(const PrepareOptions& opt) {
  if (opt.tokenizer_from.empty()) {
    return {opt.tokenizer, opt.tokenizer == "hf" ? opt.tokenizer_file : opt.spm_model};
  }
  const std::string dir = opt.tokenizer_from;
  if (opt.tokenizer != "byte" || !opt.tokenizer_file.empty() || !opt.spm_model.empty()) {
    throw UserError("prepare-data: --tokenizer-from " + dir +
                    " takes the place of --tokenizer, --tokenizer-file and --spm-model; give "
                    "one or the other");
  }
  if (!fs::is_directory(dir)) {
    throw UserError("prepare-data: --tokenizer-from " + dir + ": not a directory");
  }
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    return {"hf", (fs::path(dir) / "tokenizer.json").string()};
  }
  if (fs::exists(fs::path(dir) / "tokenizer.model")) {
    return {"sentencepiece", (fs::path(dir) / "tokenizer.model").string()};
  }
  throw UserError("prepare-data: --tokenizer-from " + dir +
                  ": no tokenizer.json or tokenizer.model there (expected a Hugging Face model "
                  "directory or an import-hf checkpoint)");
}

// The option checks that need no file.
static void check_options(const PrepareOptions& opt) {
  if (opt.out_dir.empty()) throw UserError("prepare-data: --out DIR is required");
  if (opt.valid_fraction < 0 || opt.valid_fraction >= 1) {
    throw UserError("prepare-data: --valid-fraction " + std::to_string(opt.valid_fraction) +
                    ": expected a value in [0, 1)");
  }
  if (opt.valid_fraction > 0 && !opt.valid_inputs.empty()) {
    throw UserError("prepare-data: use --valid-fraction or --valid-input, not both");
  }
  if (opt.shard_tokens < 1) throw UserError("prepare-data: --shard-tokens must be >= 1");
  if (opt.invalid_utf8 != "error" && opt.invalid_utf8 != "replace") {
    throw UserError("prepare-data: --invalid-utf8 " + opt.invalid_utf8 +
                    ": expected error or replace");
  }
  if (opt.format != "text" && opt.format != "sft") {
    throw UserError("prepare-data: --format " + opt.format + ": expected text or sft");
  }
  if (opt.format != "sft" && !opt.chat_template.empty()) {
    throw UserError("prepare-data: --chat-template needs --format sft");
  }
}

// --append-eod's token: --eod-id, else the tokenizer's EOS; -1 without --append-eod.
static int64_t end_of_document_id(const PrepareOptions& opt, const Tokenizer& tok) {
  if (!opt.append_eod) return -1;
  const int64_t eod = opt.eod_id >= 0 ? opt.eod_id : tok.eos_id();
  if (eod < 0) {
    throw UserError("prepare-data: --append-eod: the " + tok.name() +
                    " tokenizer has no end-of-sequence token; give one with --eod-id (e.g. " +
                    std::to_string(tok.vocab_size()) + ")");
  }
  return eod;
}

// --add-special-tokens: the post-processor's tokens, refused when it is not understood.
static SpecialTokens requested_special_tokens(const PrepareOptions& opt, const Tokenizer& tok) {
  if (!opt.add_special_tokens) return {};
  SpecialTokens special = tok.special_tokens();
  if (!special.unsupported.empty()) {
    throw UserError("prepare-data: --add-special-tokens: the " + tok.name() + " tokenizer's " +
                    special.unsupported +
                    " is not understood (expected TemplateProcessing, RobertaProcessing, "
                    "BertProcessing, ByteLevel or none)");
  }
  return special;
}

Manifest prepare_data(const PrepareOptions& opt, const ProgressFn& progress) {
  check_options(opt);
  const auto [kind, model_file] = tokenizer_choice(opt);
  auto tok = make_tokenizer(kind, model_file);
  const int64_t eod = end_of_document_id(opt, *tok);
  DocumentEncoder enc(*tok, opt.invalid_utf8 == "replace", eod);
  enc.special = requested_special_tokens(opt, *tok);
  const int64_t vocab = std::max(tok->vocab_size(), eod + 1);
  const bool sft = opt.format == "sft";
  std::optional<SftEncoder> sft_encoder;
  if (sft) {
    // The chat template and bos/eos texts live beside the tokenizer's file.
    const std::string dir = !opt.tokenizer_from.empty() ? opt.tokenizer_from
                            : model_file.empty()        ? std::string()
                                                 : fs::path(model_file).parent_path().string();
    sft_encoder.emplace(*tok, load_chat_setup(dir, opt.chat_template), enc.special);
  }
  const auto train_files = expand_inputs(opt.inputs);
  const auto valid_files =
      opt.valid_inputs.empty() ? std::vector<std::string>{} : expand_inputs(opt.valid_inputs);
  // Written under a sibling name and renamed when complete: a failure (a bad JSONL line, a full
  // disk) leaves nothing behind.
  StagedDir out("prepare-data", opt.out_dir,
                "prepare-data: " + opt.out_dir +
                    ": exists and is not empty; choose a new directory (nothing was "
                    "written)");

  uint64_t total = 0, done = 0;
  for (const auto* list : {&train_files, &valid_files}) {
    for (const auto& f : *list) total += fs::file_size(f);
  }
  const int threads = std::max(1, opt.threads);
  SplitWriter train(out.path(), "train", opt.shard_tokens, vocab, tok->name(), sft);
  SplitWriter valid(out.path(), "valid", opt.shard_tokens, vocab, tok->name(), sft);
  std::atomic<int64_t> targets{0};
  bool any_valid = !valid_files.empty();
  int64_t skipped = 0;
  for (const auto& f : train_files) {
    if (sft) {
      const bool split = opt.valid_fraction > 0;
      skipped += tokenize_sft(f, opt, enc, *sft_encoder,
                              {train, split ? &valid : nullptr, opt.valid_fraction}, done, total,
                              progress, targets);
      any_valid = any_valid || split;
      continue;
    }
    if (is_jsonl(f, opt.jsonl)) {
      const bool split = opt.valid_fraction > 0;
      skipped += tokenize_jsonl(f, opt, enc, {train, split ? &valid : nullptr, opt.valid_fraction},
                                done, total, progress);
      any_valid = any_valid || split;
      continue;
    }
    const uint64_t size = fs::file_size(f);
    const uint64_t cut =
        opt.valid_fraction > 0 ? valid_cut(f, size, opt.valid_fraction, tok->cut_anywhere()) : size;
    tokenize_range(f, 0, cut, enc, threads, train, done, total, progress);
    if (cut < size) {
      tokenize_range(f, cut, size, enc, threads, valid, done, total, progress);
      any_valid = true;
    }
  }
  for (const auto& f : valid_files) {
    if (sft) {
      std::atomic<int64_t> valid_targets{0};  // counted for the training split only
      skipped += tokenize_sft(f, opt, enc, *sft_encoder, {valid, nullptr, 0.0}, done, total,
                              progress, valid_targets);
      continue;
    }
    if (is_jsonl(f, opt.jsonl)) {
      skipped += tokenize_jsonl(f, opt, enc, {valid, nullptr, 0.0}, done, total, progress);
      continue;
    }
    tokenize_range(f, 0, fs::file_size(f), enc, threads, valid, done, total, progress);
  }
  Manifest m;
  m.vocab_size = vocab;
  m.tokenizer = tok->name();
  m.eod_id = eod;
  m.skipped_lines = skipped;
  m.invalid_utf8_replaced = enc.replaced.load();
  m.loss_mask = sft;
  m.target_tokens = targets.load();
  m.splits["train"] = train.finish();
  if (any_valid) m.splits["valid"] = valid.finish();
  save_manifest(out.path(), m);
  out.commit();
  return m;
}

}  // namespace moe::data
