// Hugging Face tokenizer.json, BPE: byte-level (GPT-2, Llama-3 style: added tokens split out
// first, the pre-tokenizer's split regex (PCRE2 with Unicode properties: Debian's libpcre2),
// GPT-2's byte-to-unicode mapping, then the ranked merges), or SentencePiece-converted (Llama-2,
// Mixtral: Prepend/Replace normalizers, no pre-tokenizer, byte fallback, a fused unknown
// token). Anything else the file asks for (other normalizers, models or pre-tokenizers) is
// refused by name.
#include "moe/data/hf_bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"

namespace moe::data {

namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n, as UTF-8.
std::array<std::string, 256> byte_to_unicode() {
  std::array<std::string, 256> out;
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[b] = utf8(printable ? b : 256 + n++);
  }
  return out;
}

// Splits a UTF-8 string into its code points (as strings).
std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}

struct BpeFlags {
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  std::string unk_token;  // empty: none
};

// The BPE model: vocabulary and merge ranks ("a b" strings or [a, b] pairs), and its flags.
// Anything but BPE, and subword prefixes/suffixes or dropout, are refused.
BpeFlags read_bpe_model(const json& model, std::unordered_map<std::string, int64_t>& vocab,
                        std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>& merges,
                        const std::function<void(const std::string&)>& refuse) {
  if (model.value("type", std::string()) != "BPE") refuse("model.type is not BPE");
  if (model.contains("dropout") && !model["dropout"].is_null()) refuse("model.dropout");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model[k].is_null() && model[k] != "") {
      refuse(std::string("model.") + k + " is not supported");
    }
  }
  for (const auto& [token, id] : model.at("vocab").items()) vocab[token] = id.get<int64_t>();
  int64_t rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) refuse("merge \"" + s + "\" has no space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
    }
    // By vocabulary ids, as `tokenizers` holds them (it refuses a merge of, or into, a token
    // outside the vocabulary when it loads the file; so do we).
    const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end()) {
      refuse("merge \"" + a + " " + b + "\" (rank " + std::to_string(rank) +
             ") names a token outside the vocabulary");
    }
    merges.emplace(pair_key(ia->second, ib->second),
                   std::make_pair(static_cast<int32_t>(rank), static_cast<int32_t>(iab->second)));
    ++rank;
  }
  BpeFlags f;
  f.ignore_merges = model.value("ignore_merges", false);
  f.byte_fallback = model.value("byte_fallback", false);
  f.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    f.unk_token = model["unk_token"].get<std::string>();
    if (!vocab.count(f.unk_token))
      refuse("model.unk_token " + f.unk_token + " is not in the vocabulary");
  }
  return f;
}

// The normalizers SentencePiece-converted BPE files (Llama-2, Mixtral) use: Prepend and
// Replace of a plain string, alone or in a Sequence; null is none. Others are refused by name.
std::vector<HfNormalizerStep> read_normalizer(
    const json& n, const std::function<void(const std::string&)>& refuse) {
  std::vector<HfNormalizerStep> steps;
  if (n.is_null()) return steps;
  const std::string type = n.value("type", std::string("?"));
  if (type == "Sequence") {
    for (const auto& step : n.at("normalizers")) {
      for (auto& s : read_normalizer(step, refuse)) steps.push_back(std::move(s));
    }
  } else if (type == "Prepend") {
    steps.push_back({true, n.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    const json& p = n.at("pattern");
    if (!p.contains("String")) refuse("normalizer Replace with a Regex pattern");
    const std::string from = p["String"].get<std::string>();
    if (from.empty()) refuse("normalizer Replace of an empty string");
    steps.push_back({false, from, n.at("content").get<std::string>()});
  } else {
    refuse("normalizer " + type + " is not supported");
  }
  return steps;
}

// The pre-tokenizer's split regex: ByteLevel (GPT-2's), or Sequence[Split(regex),
// ByteLevel(no regex)]; sets add_prefix_space from the ByteLevel step.
std::string split_pattern(const json& pre, bool& add_prefix_space,
                          const std::function<void(const std::string&)>& refuse) {
  std::string pattern;
  if (pre.is_null()) return pattern;  // none: each segment is one piece (Llama-2, Mixtral)
  auto byte_level = [&](const json& p) {
    add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) pattern = kGpt2Pattern;
  };
  if (pre.value("type", std::string()) == "ByteLevel") {
    byte_level(pre);
  } else if (pre.value("type", std::string()) == "Sequence") {
    const json& list = pre.at("pretokenizers");
    if (list.size() != 2 || list[0].value("type", std::string()) != "Split" ||
        list[1].value("type", std::string()) != "ByteLevel") {
      refuse("pre_tokenizer Sequence other than [Split, ByteLevel]");
    }
    const json& split = list[0];
    if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false)) {
      refuse("Split behavior other than Isolated");
    }
    const json& p = split.at("pattern");
    if (!p.contains("Regex")) refuse("Split pattern other than a Regex");
    pattern = p["Regex"].get<std::string>();
    byte_level(list[1]);
    if (list[1].value("use_regex", true)) refuse("a Split followed by ByteLevel's own regex");
  } else {
    refuse("pre_tokenizer " + pre.value("type", std::string("?")));
  }
  if (pattern.empty()) refuse("a pre-tokenizer without a split regex");
  return pattern;
}

}  // namespace

struct HfBpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

void HfBpeTokenizer::compile_split(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  regex_ = std::make_shared<Regex>();
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (regex_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw UserError("tokenizer: " + path_ +
                    ": the pre-tokenizer regex does not compile at offset " +
                    std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);  // faster when available
}

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) : path_(path) {
  std::ifstream in(path);
  if (!in) throw UserError("tokenizer: " + path + ": cannot open");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw UserError("tokenizer: " + path + ": invalid JSON: " + e.what());
  }
  auto refuse = [&](const std::string& what) {
    throw UserError("tokenizer: " + path + ": " + what +
                    " (supported: BPE as GPT-2, Llama-3, Llama-2 and Mixtral use it)");
  };
  try {
    const BpeFlags flags = read_bpe_model(j.at("model"), vocab_, merges_, refuse);
    ignore_merges_ = flags.ignore_merges;
    byte_fallback_ = flags.byte_fallback;
    fuse_unk_ = flags.fuse_unk;
    unk_ = flags.unk_token.empty() ? -1 : vocab_.at(flags.unk_token);
    normalizer_ = read_normalizer(j.value("normalizer", json()), refuse);
    const json pre = j.value("pre_tokenizer", json());
    const std::string pattern = split_pattern(pre, add_prefix_space_, refuse);
    byte_level_ = !pre.is_null();  // every accepted pre-tokenizer ends in ByteLevel
    // ByteLevel prepends its space to each split it is given: after a Split step, every piece;
    // alone (its own regex), every segment between added tokens.
    prefix_each_piece_ = add_prefix_space_ && pre.value("type", "") == "Sequence";
    if (!pattern.empty()) compile_split(pattern);
    for (const auto& t : j.value("added_tokens", json::array())) {
      if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false)) {
        refuse("added token " + t.value("content", std::string()) +
               " with lstrip/rstrip/single_word");
      }
      added_.push_back({t.at("content").get<std::string>(), t.at("id").get<int64_t>(),
                        t.value("special", false)});
    }
  } catch (const json::exception& e) {
    throw UserError("tokenizer: " + path + ": " + e.what());
  }
  // Longest first, so that "<|end|>" does not shadow "<|end|>x" style overlaps.
  std::stable_sort(added_.begin(), added_.end(), [](const Added& a, const Added& b) {
    return a.content.size() > b.content.size();
  });
  for (const auto& a : added_) {
    if (!a.content.empty()) added_first_[static_cast<unsigned char>(a.content[0])] = true;
  }
  for (const auto& [t, id] : vocab_) vocab_size_ = std::max(vocab_size_, id + 1);
  for (const auto& a : added_) vocab_size_ = std::max(vocab_size_, a.id + 1);
  for (const auto& a : added_) {
    for (const char* eos : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>"}) {
      if (a.special && a.content == eos && eos_ < 0) eos_ = a.id;
    }
  }
  bytes_ = byte_to_unicode();
}

std::string HfBpeTokenizer::name() const {
  const size_t slash = path_.find_last_of('/');
  return "hf-bpe:" + (slash == std::string::npos ? path_ : path_.substr(slash + 1));
}

namespace {

// Whether the code point at `at` (a lead byte) is white space to the pre-tokenizers' \s (PCRE2
// with UCP: Unicode White_Space), decoding multi-byte sequences.
bool space_at(const std::string& s, size_t at) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(at);
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r');
  uint32_t cp = 0;
  size_t n = 0;
  if ((c & 0xE0) == 0xC0)
    cp = c & 0x1F, n = 1;
  else if ((c & 0xF0) == 0xE0)
    cp = c & 0x0F, n = 2;
  else if ((c & 0xF8) == 0xF0)
    cp = c & 0x07, n = 3;
  if (n == 0 || at + n >= s.size()) return false;  // not a lead byte, or cut short
  for (size_t i = 1; i <= n; ++i) cp = (cp << 6) | (b(at + i) & 0x3F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The lead byte of the code point that ends just before `at`.
size_t previous_char(const std::string& s, size_t at) {
  size_t i = at - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

size_t HfBpeTokenizer::last_cut(const std::string& chunk) const {
  // Without a pre-tokenizer a merge may span anything, and a Prepend normalizer would add its
  // prefix at a cut: such text is never cut.
  if (!regex_ || std::any_of(normalizer_.begin(), normalizer_.end(),
                             [](const HfNormalizerStep& s) { return s.prepend; })) {
    return 0;
  }
  // After a newline between two non-space characters ("x\ny"): the families' pre-tokenizers
  // end a piece after such a newline (Llama-3 glues "x" punctuation and newlines; GPT-2 and
  // Qwen keep newlines apart) and start one at "y", and none looks behind. A newline next to
  // other white space ("x \n", "\r\n", "\n  y") is not a cut: \s+(?!\S) would glue it
  // differently at the end of a chunk than in the whole text.
  for (size_t nl = chunk.rfind('\n'); nl != std::string::npos && nl > 0;
       nl = chunk.rfind('\n', nl - 1)) {
    if (nl + 1 < chunk.size() && !space_at(chunk, nl + 1) &&
        !space_at(chunk, previous_char(chunk, nl))) {
      return nl + 1;
    }
  }
  return std::string::npos;
}

// One piece's ids: from the shared cache, or merged and cached. The merge is tokenizers'
// (models/bpe/word.rs): a min-heap of candidate pairs by (rank, position) over a linked list of
// symbols, so each merge costs O(log n) and nothing is rescanned; a popped pair whose symbols
// changed since it was pushed is stale and skipped.
void HfBpeTokenizer::bpe(const std::string& piece, std::vector<uint32_t>& out) const {
  CacheShard& shard = cache_[std::hash<std::string>{}(piece) % cache_.size()];
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto hit = shard.ids.find(piece);
    if (hit != shard.ids.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::string mapped;
  if (byte_level_) {
    for (unsigned char c : piece) mapped += bytes_[c];
  } else {
    mapped = piece;
  }
  std::vector<uint32_t> ids;
  auto whole = vocab_.find(mapped);
  if (ignore_merges_ && whole != vocab_.end()) {
    ids.push_back(static_cast<uint32_t>(whole->second));
  } else {
    ids = merge(mapped);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (piece.size() > kMaxCachedPieceBytes) return;  // a whole segment (no pre-tokenizer)
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.ids.size() < kCacheEntriesPerShard) shard.ids.emplace(piece, std::move(ids));
}

std::vector<uint32_t> HfBpeTokenizer::merge(const std::string& mapped) const {
  struct Symbol {
    int64_t id;
    int32_t prev, next;
    bool gone;
  };
  // The symbols, as tokenizers' merge_word makes them: a character in the vocabulary is its
  // id; else, with byte_fallback, its UTF-8 bytes as <0xXX> tokens (when all exist); else the
  // unknown token (one for a run of them with fuse_unk).
  std::vector<Symbol> sym;
  bool last_unknown = false;
  auto add = [&](int64_t id) {
    const auto n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, false});
  };
  for (const std::string& ch : utf8_chars(mapped)) {
    if (auto v = vocab_.find(ch); v != vocab_.end()) {
      add(v->second);
      last_unknown = false;
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (unsigned char b : ch) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        if (auto v = vocab_.find(name); v != vocab_.end()) bytes.push_back(v->second);
      }
      if (bytes.size() == ch.size()) {
        for (int64_t id : bytes) add(id);
        last_unknown = false;
        continue;
      }
    }
    if (unk_ < 0) {
      throw UserError("tokenizer: " + path_ + ": no vocabulary entry for \"" + ch +
                      "\" and no unk_token");
    }
    if (!(fuse_unk_ && last_unknown)) add(unk_);
    last_unknown = true;
  }
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto m = merges_.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
    if (m != merges_.end()) heap.push({m->second.first, pos, m->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (left.gone || left.next < 0) continue;
    auto m = merges_.find(pair_key(left.id, sym[left.next].id));
    if (m == merges_.end() || m->second.first != c.rank) continue;  // stale
    Symbol& right = sym[left.next];
    left.id = c.merged;
    right.gone = true;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    push(left.prev);
    push(c.pos);
  }
  std::vector<uint32_t> ids;
  for (const Symbol& x : sym) {
    if (!x.gone) ids.push_back(static_cast<uint32_t>(x.id));
  }
  return ids;
}

std::string HfBpeTokenizer::normalize(std::string text) const {
  for (const HfNormalizerStep& step : normalizer_) {
    if (step.prepend) {
      if (!text.empty()) text.insert(0, step.from);
      continue;
    }
    std::string out;
    size_t at = 0;
    for (size_t hit = text.find(step.from); hit != std::string::npos;
         hit = text.find(step.from, at)) {
      out.append(text, at, hit - at).append(step.to);
      at = hit + step.from.size();
    }
    out.append(text, at, std::string::npos);
    text = std::move(out);
  }
  return text;
}

void HfBpeTokenizer::encode_segment(const std::string& raw, std::vector<uint32_t>& out) const {
  if (raw.empty()) return;
  // Normalizers apply to each segment between added tokens (a Prepend once per segment).
  const std::string text = normalizer_.empty() ? raw : normalize(raw);
  if (!regex_) {  // no pre-tokenizer: the segment is one piece
    bpe(text, out);
    return;
  }
  const std::string s =
      add_prefix_space_ && !prefix_each_piece_ && text[0] != ' ' ? " " + text : text;
  auto piece = [&](const std::string& p) {
    bpe(prefix_each_piece_ && p[0] != ' ' ? " " + p : p, out);
  };
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  size_t pos = 0;
  while (pos < s.size()) {
    // PCRE2_NO_UTF_CHECK: encode() validated the text once; without it every call re-validates
    // the rest of the subject, which made long documents quadratic.
    const int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // no more matches: the rest is one piece
      piece(s.substr(pos));
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      pcre2_match_data_free(md);
      throw std::runtime_error("tokenizer: " + path_ + ": pre-tokenizer regex failed: " +
                               reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > pos) piece(s.substr(pos, ov[0] - pos));  // a gap: its own piece
    if (ov[1] == ov[0]) {                                // an empty match: step one code point
      size_t n = 1;
      while (ov[1] + n < s.size() && (static_cast<unsigned char>(s[ov[1] + n]) & 0xC0) == 0x80) ++n;
      piece(s.substr(ov[1], n));
      pos = ov[1] + n;
      continue;
    }
    piece(s.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  pcre2_match_data_free(md);
}

void HfBpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    throw InvalidUtf8Error(bad);
  }
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!added_first_[static_cast<unsigned char>(text[i])]) {  // the common case: no token here
      ++i;
      continue;
    }
    const Added* found = nullptr;
    for (const auto& a : added_) {
      if (a.content.empty()) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) {
        found = &a;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    encode_segment(std::string(text.substr(start, i - start)), out);
    out.push_back(static_cast<uint32_t>(found->id));
    i += found->content.size();
    start = i;
  }
  encode_segment(std::string(text.substr(start)), out);
}

}  // namespace moe::data
