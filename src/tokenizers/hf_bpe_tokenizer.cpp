#include "moe/tokenizers/hf_bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "moe/tokenizers/hf_decoder.h"
#include "moe/tokenizers/utf8.h"
#include "moe/util/errors.h"
#include "moe/util/json_nesting.h"

namespace moe::tokenizers {

namespace {

using nlohmann::json;
using Refuse = std::function<void(const std::string&)>;

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}

// A token id: an integer in [0, 2^31) (`tokenizers` keeps u32 ids, our merge table int32).
int64_t token_id(const json& id, const std::string& what, const Refuse& refuse) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (!id.is_number_integer() ||
      (id.is_number_unsigned() ? id.get<uint64_t>() > kMax
                               : id.get<int64_t>() < 0 || id.get<int64_t>() > kMax)) {
    refuse(what + " has id " + id.dump() + ": expected an integer from 0 to " +
           std::to_string(kMax));
  }
  return id.get<int64_t>();
}

std::string optional_string(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// The BPE model's merges ("a b" strings or [a, b] pairs) by vocabulary ids, as `tokenizers`
// holds them: it refuses a merge of, or into, a token outside the vocabulary when it loads the
// file, and so do we. With a continuing_subword_prefix the merged token is a + b less b's prefix.
void read_merges(const json& model, const std::unordered_map<std::string, int64_t>& vocab,
                 size_t prefix_bytes,
                 std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>& merges,
                 const Refuse& refuse) {
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
    const auto ia = vocab.find(a), ib = vocab.find(b);
    const auto iab = vocab.find(a + b.substr(std::min(prefix_bytes, b.size())));
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end()) {
      refuse("merge \"" + a + " " + b + "\" (rank " + std::to_string(rank) +
             ") names a token outside the vocabulary");
    }
    merges.emplace(pair_key(ia->second, ib->second),
                   std::make_pair(static_cast<int32_t>(rank), static_cast<int32_t>(iab->second)));
    ++rank;
  }
}

// The ids of a special token named in a post-processor (TemplateProcessing's special_tokens
// table, or Roberta/Bert's [token, id] pairs).
void append_template(const json& pp, SpecialTokens& st, const Refuse& refuse) {
  const std::string type = pp.value("type", std::string("?"));
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : pp.at("processors")) append_template(p, st, refuse);
    return;
  }
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const auto& item : pp.at("single")) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", std::string("A")) != "A") refuse("template sequence B");
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      for (const auto& id : pp.at("special_tokens").at(name).at("ids")) {
        (seen_sequence ? st.after : st.before)
            .push_back(static_cast<uint32_t>(
                token_id(id, "post_processor special token " + name, refuse)));
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    st.before.push_back(
        static_cast<uint32_t>(token_id(pp.at("cls").at(1), "post_processor cls", refuse)));
    st.after.push_back(
        static_cast<uint32_t>(token_id(pp.at("sep").at(1), "post_processor sep", refuse)));
    return;
  }
  st.unsupported = "post_processor " + type;
}

SpecialTokens read_post_processor(const json& pp, const Refuse& refuse) {
  SpecialTokens st;
  st.unsupported.clear();
  if (!pp.is_null()) append_template(pp, st, refuse);
  return st;
}

// (left id << 32 | right id) -> (merge rank, merged id), as HfBpeTokenizer::merges_.
using MergeTable = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;

// One symbol of a word being merged: a linked list over a vector; merged-away symbols stay,
// gone.
struct Symbol {
  int64_t id;
  int32_t prev, next;
  bool gone;
};

void append_symbol(std::vector<Symbol>& sym, int64_t id) {
  const auto n = static_cast<int32_t>(sym.size());
  if (n > 0) sym.back().next = n;
  sym.push_back({id, n - 1, -1, false});
}

// byte_fallback: the <0xXX> tokens of `bytes` onto sym when the vocabulary has all of them.
bool append_byte_fallback(std::string_view bytes,
                          const std::unordered_map<std::string, int64_t>& vocab,
                          std::vector<Symbol>& sym) {
  std::vector<int64_t> ids;
  for (unsigned char b : bytes) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (const auto v = vocab.find(name); v != vocab.end()) ids.push_back(v->second);
  }
  if (ids.size() != bytes.size()) return false;
  for (int64_t b : ids) append_symbol(sym, b);
  return true;
}

// Word::merge_all: a min-heap of candidate pairs by (rank, position) over the linked list of
// symbols: each merge costs O(log n), nothing is rescanned, and a popped pair whose symbols
// changed since it was pushed is stale and skipped. The ids of the symbols left.
std::vector<uint32_t> merge_all(std::vector<Symbol>& sym, const MergeTable& merges) {
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto m = merges.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
    if (m != merges.end()) heap.push({m->second.first, pos, m->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (left.gone || left.next < 0) continue;
    auto m = merges.find(pair_key(left.id, sym[left.next].id));
    if (m == merges.end() || m->second.first != c.rank) continue;  // stale
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

// tokenizer.json, read and parsed (UserError when unreadable, too deeply nested or not JSON).
json read_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("tokenizer: " + path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (json_nests_deeper_than(text)) {
    throw UserError("tokenizer: " + path + ": JSON nested more than " +
                    std::to_string(max_json_nesting()) + " levels deep" +
                    raise_hint("json.nesting"));
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UserError("tokenizer: " + path + ": invalid JSON: " + e.what());
  }
}

// model.vocab by token, and its one-code-point entries by code point.
void read_vocab(const json& model, std::unordered_map<std::string, int64_t>& vocab,
                std::unordered_map<uint32_t, int64_t>& char_ids, const Refuse& refuse) {
  for (const auto& [token, id] : model.at("vocab").items()) {
    vocab[token] = token_id(id, "model.vocab[\"" + token + "\"]", refuse);
  }
  for (const auto& [token, id] : vocab) {
    size_t n = 0;
    if (!token.empty() && utf8::length(static_cast<unsigned char>(token[0])) == token.size()) {
      char_ids.emplace(utf8::decode(token, 0, n), id);
    }
  }
}

// One entry of added_tokens, checked: lstrip / rstrip / single_word refused, the id in range.
struct AddedToken {
  std::string content;
  int64_t id;
  bool normalized, special;
};

// The non-empty entries of added_tokens, in the file's order.
std::vector<AddedToken> read_added_tokens(const json& list, const Refuse& refuse) {
  std::vector<AddedToken> out;
  for (const auto& t : list) {
    std::string content = t.at("content").get<std::string>();
    if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false)) {
      refuse("added token " + content + " with lstrip/rstrip/single_word");
    }
    if (content.empty()) continue;
    const bool normalized = t.value("normalized", !t.value("special", false));
    const int64_t id = token_id(t.at("id"), "added token " + content, refuse);
    out.push_back({std::move(content), id, normalized, t.value("special", false)});
  }
  return out;
}

// The special tokens that end a document in the families we read (the first one found is eos).
bool is_eos_text(const std::string& content) {
  static constexpr const char* kEos[] = {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>",
                                         "<\xEF\xBD\x9C"
                                         "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"};
  return std::any_of(std::begin(kEos), std::end(kEos),
                     [&](const char* eos) { return content == eos; });
}

// Longest first: the first token that matches at a position is the longest one there; and the
// table of the bytes a token of the list starts with.
template <class List>
void sort_longest_first(List& list, std::array<bool, 256>& first_bytes) {
  std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  for (const auto& a : list) first_bytes[static_cast<unsigned char>(a.content[0])] = true;
}

}  // namespace

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) : path_(path) {
  const json j = read_tokenizer_json(path);
  const Refuse refuse = [&](const std::string& what) {
    throw UserError("tokenizer: " + path + ": " + what +
                    " (supported: BPE with the normalizers and pre-tokenizers of GPT-2, "
                    "Llama-2/3, Mixtral, Qwen2/3, OLMoE and DeepSeek-V3; see docs/data-format.md)");
  };
  try {
    const json& model = j.at("model");
    if (model.value("type", std::string()) != "BPE") refuse("model.type is not BPE");
    if (model.contains("dropout") && !model["dropout"].is_null()) refuse("model.dropout");
    read_vocab(model, vocab_, char_ids_, refuse);
    subword_prefix_ = optional_string(model, "continuing_subword_prefix");
    word_suffix_ = optional_string(model, "end_of_word_suffix");
    read_merges(model, vocab_, subword_prefix_.size(), merges_, refuse);
    ignore_merges_ = model.value("ignore_merges", false);
    byte_fallback_ = model.value("byte_fallback", false);
    fuse_unk_ = model.value("fuse_unk", false);
    if (const std::string unk = optional_string(model, "unk_token"); !unk.empty()) {
      if (!vocab_.count(unk)) refuse("model.unk_token " + unk + " is not in the vocabulary");
      unk_ = vocab_.at(unk);
    }
    normalizer_ = HfNormalizer(j.value("normalizer", json()), refuse);
    pre_tokenizer_ = HfPreTokenizer(j.value("pre_tokenizer", json()), refuse, path);
    special_ = read_post_processor(j.value("post_processor", json()), refuse);
    decoder_ = HfDecoder(j.value("decoder", json()));
    for (const AddedToken& t : read_added_tokens(j.value("added_tokens", json::array()), refuse)) {
      (t.normalized && !normalizer_.empty() ? normalized_added_ : raw_added_)
          .push_back({t.content, t.id});
      vocab_size_ = std::max(vocab_size_, t.id + 1);
      name_id(t.content, t.id, t.special);
      if (!t.special) continue;
      special_texts_.push_back(t.content);
      if (eos_ < 0 && is_eos_text(t.content)) eos_ = t.id;
    }
  } catch (const json::exception& e) {
    throw UserError("tokenizer: " + path + ": " + e.what());
  }
  sort_longest_first(raw_added_, raw_added_first_);
  sort_longest_first(normalized_added_, normalized_added_first_);
  for (const auto& [t, id] : vocab_) {
    vocab_size_ = std::max(vocab_size_, id + 1);
    if (static_cast<size_t>(id) >= id_tokens_.size() || id_tokens_[id].empty())
      name_id(t, id, false);
  }
  bytes_ = gpt2_byte_to_unicode();
}

void HfBpeTokenizer::name_id(const std::string& token, int64_t id, bool special) {
  if (static_cast<size_t>(id) >= id_tokens_.size()) {
    id_tokens_.resize(id + 1);
    special_ids_.resize(id + 1, false);
  }
  id_tokens_[id] = token;
  special_ids_[id] = special_ids_[id] || special;
}

std::string HfBpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  if (!decoder_.unsupported().empty())
    throw UserError("tokenizer: " + path_ + ": cannot decode: " + decoder_.unsupported());
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_tokens_.size()) continue;  // as tokenizers
    if (skip_special && special_ids_[id]) continue;
    tokens.push_back(id_tokens_[id]);
  }
  return decoder_.decode(std::move(tokens));
}

std::string HfBpeTokenizer::name() const {
  const size_t slash = path_.find_last_of('/');
  return "hf-bpe:" + (slash == std::string::npos ? path_ : path_.substr(slash + 1));
}

size_t HfBpeTokenizer::last_cut(const std::string& chunk) const {
  // Without a pre-tokenizer a merge may span anything; a Prepend or Strip normalizer, or a
  // pre-tokenizer that prefixes segments, would change the text at every cut; an added token
  // with a newline could straddle one. Such text is never cut.
  auto has_newline = [](const std::vector<Added>& list) {
    return std::any_of(list.begin(), list.end(),
                       [](const Added& a) { return a.content.find('\n') != std::string::npos; });
  };
  if (pre_tokenizer_.empty() || normalizer_.depends_on_ends() ||
      pre_tokenizer_.prefixes_segments() || has_newline(raw_added_) ||
      has_newline(normalized_added_)) {
    return 0;
  }
  // After a newline between two non-space characters ("x\ny"): the families' pre-tokenizers
  // end a piece after such a newline (Llama-3 and DeepSeek glue punctuation and newlines; GPT-2
  // and Qwen keep newlines apart) and start one at "y", and none looks behind. A newline next to
  // other white space ("x \n", "\r\n", "\n  y") is not a cut: \s+(?!\S) would glue it
  // differently at the end of a chunk than in the whole text.
  size_t n = 0;
  for (size_t nl = chunk.rfind('\n'); nl != std::string::npos && nl > 0;
       nl = chunk.rfind('\n', nl - 1)) {
    if (nl + 1 < chunk.size() && (chunk[nl + 1] & 0xC0) != 0x80 &&
        nl + 1 + utf8::length(static_cast<unsigned char>(chunk[nl + 1])) <= chunk.size() &&
        !utf8::is_white_space(utf8::decode(chunk, nl + 1, n)) &&
        !utf8::is_white_space(utf8::decode(chunk, utf8::previous(chunk, nl), n))) {
      return nl + 1;
    }
  }
  return std::string::npos;
}

int64_t HfBpeTokenizer::symbol_id(std::string_view symbol) const {
  const auto v = vocab_.find(std::string(symbol));
  return v == vocab_.end() ? -1 : v->second;
}

// One piece's ids: from the shared cache, or merged and cached.
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
  if (pre_tokenizer_.byte_level()) {
    for (unsigned char c : piece) mapped += bytes_[c];
  } else {
    mapped = piece;
  }
  std::vector<uint32_t> ids;
  if (const int64_t whole = ignore_merges_ ? symbol_id(mapped) : -1; whole >= 0) {
    ids.push_back(static_cast<uint32_t>(whole));
  } else {
    ids = merge_word(mapped);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (piece.size() > kMaxCachedPieceBytes) return;  // a whole segment (no pre-tokenizer)
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.ids.size() < kCacheEntriesPerShard) shard.ids.emplace(piece, std::move(ids));
}

// tokenizers' BPE::merge_word, then Word::merge_all (merge_all above): the symbols are the
// characters (with the subword prefix on all but the first and the word suffix on the last); one
// missing from the vocabulary becomes its UTF-8 bytes as <0xXX> tokens with byte_fallback (when
// all exist), else the unknown token, one for a run of them with fuse_unk (an unknown is written
// when the next known character comes, as there).
std::vector<uint32_t> HfBpeTokenizer::merge_word(const std::string& w) const {
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  bool unknown_pending = false;
  for (size_t i = 0, n = 0; i < w.size(); i += n) {
    const uint32_t cp = utf8::decode(w, i, n);
    const bool prefixed = i > 0 && !subword_prefix_.empty();
    const bool suffixed = i + n == w.size() && !word_suffix_.empty();
    std::string decorated;
    int64_t id = -1;
    if (prefixed || suffixed) {
      decorated =
          (prefixed ? subword_prefix_ : "") + w.substr(i, n) + (suffixed ? word_suffix_ : "");
      id = symbol_id(decorated);
    } else if (auto c = char_ids_.find(cp); c != char_ids_.end()) {
      id = c->second;
    }
    if (id >= 0) {
      if (unknown_pending) append_symbol(sym, unk_);
      unknown_pending = false;
      append_symbol(sym, id);
      continue;
    }
    const std::string_view bytes =
        prefixed || suffixed ? std::string_view(decorated) : std::string_view(w).substr(i, n);
    if (byte_fallback_ && append_byte_fallback(bytes, vocab_, sym)) continue;
    if (unk_ < 0) {
      throw UserError("tokenizer: " + path_ + ": no vocabulary entry for \"" + w.substr(i, n) +
                      "\" and no unk_token");
    }
    if (unknown_pending && !fuse_unk_) append_symbol(sym, unk_);
    unknown_pending = true;
  }
  if (unknown_pending) append_symbol(sym, unk_);
  return merge_all(sym, merges_);
}

void HfBpeTokenizer::split_added(
    const std::string& text, const std::vector<Added>& tokens,
    const std::array<bool, 256>& first_bytes, std::vector<uint32_t>& out,
    const std::function<void(const std::string&, size_t)>& segment) const {
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!first_bytes[static_cast<unsigned char>(text[i])]) {  // the common case: no token here
      ++i;
      continue;
    }
    const Added* found = nullptr;
    for (const auto& a : tokens) {
      if (text.compare(i, a.content.size(), a.content) == 0) {
        found = &a;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > start) segment(text.substr(start, i - start), start);
    out.push_back(static_cast<uint32_t>(found->id));
    i += found->content.size();
    start = i;
  }
  if (start < text.size()) segment(text.substr(start), start);
}

void HfBpeTokenizer::encode_segment(const std::string& raw, bool at_text_start,
                                    std::vector<uint32_t>& out) const {
  // The normalizer applies to each segment between (raw) added tokens; normalized added tokens
  // are then split out of its output.
  const std::string text = normalizer_.empty() ? raw : normalizer_.apply(raw);
  std::vector<std::string> pieces;
  auto tokenize = [&](const std::string& part, size_t offset) {
    pieces.clear();
    pre_tokenizer_.split(part, at_text_start && offset == 0, pieces);
    for (const std::string& p : pieces) bpe(p, out);
  };
  if (normalized_added_.empty()) {
    tokenize(text, 0);
  } else {
    split_added(text, normalized_added_, normalized_added_first_, out, tokenize);
  }
}

void HfBpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    throw InvalidUtf8Error(bad);
  }
  split_added(std::string(text), raw_added_, raw_added_first_, out,
              [&](const std::string& segment, size_t offset) {
                encode_segment(segment, offset == 0, out);
              });
}

}  // namespace moe::tokenizers
