#include "moe/tokenizers/hf_pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "moe/util/errors.h"
#include "moe/util/input_limits.h"

namespace moe::tokenizers {

namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The character classes of `tokenizers`' char-predicate pre-tokenizers, one character a match:
// Rust's char::is_numeric (Digits), is_ascii_punctuation || is_punctuation (Punctuation),
// is_whitespace (WhitespaceSplit; White_Space spelled out, as PCRE2's \s adds U+180E).
constexpr const char* kNumeric = R"(\p{N})";
constexpr const char* kPunctuation = R"([\p{P}!-\/:-@\[-`{-~])";
constexpr const char* kWhiteSpace =
    R"([\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}])";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_named(const std::string& name, const HfPreTokenizer::Refuse& refuse) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  refuse("split behavior " + name);
  return Behavior::kIsolated;
}

struct Span {
  size_t begin, end;
  bool match;
};

// tokenizers' SplitDelimiterBehavior applied to the pattern's matches and the gaps between them.
std::vector<Span> apply_behavior(std::vector<Span> spans, Behavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return spans;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) out.push_back(s);
      }
      return out;
    case Behavior::kMergedWithPrevious:  // a match joins the gap before it
      for (const Span& s : spans) {
        if (s.match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.match;
      }
      return out;
    case Behavior::kMergedWithNext:  // a match joins the gap after it
      for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
        if (s->match && !previous_match && !out.empty()) {
          out.back().begin = s->begin;
        } else {
          out.push_back(*s);
        }
        previous_match = s->match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::kContiguous:  // runs of matches (and of gaps) join
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].match == previous_match) {
          out.back().end = spans[i].end;
        } else {
          out.push_back(spans[i]);
        }
        previous_match = spans[i].match;
      }
      return out;
  }
  return spans;
}

// PCRE2 (since 10.40) reads \p{Han} as Script_Extensions, Oniguruma (`tokenizers`) as Script:
// U+32FF is Han to one and Common to the other. Script names become \p{sc:Name}, which PCRE2
// reads as Script; categories and other properties are left as they are.
std::string script_properties_as_oniguruma(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    size_t slashes = 0;
    while (slashes < i && pattern[i - 1 - slashes] == '\\') ++slashes;
    const bool property = (pattern[i] == 'p' || pattern[i] == 'P') && slashes % 2 == 1 &&
                          i + 1 < pattern.size() && pattern[i + 1] == '{';
    const size_t close = property ? pattern.find('}', i) : std::string::npos;
    if (close == std::string::npos) {
      out += pattern[i];
      continue;
    }
    std::string name = pattern.substr(i + 2, close - i - 2);
    const bool negated = !name.empty() && name[0] == '^';
    if (negated) name.erase(0, 1);
    const std::string script = "\\p{sc:" + name + "}";
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* probe =
        name.find_first_of(":=") == std::string::npos
            ? pcre2_compile(reinterpret_cast<PCRE2_SPTR>(script.c_str()), script.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr)
            : nullptr;
    if (probe == nullptr) {
      out += pattern[i];
      continue;
    }
    pcre2_code_free(probe);
    out += pattern[i];
    out += negated ? "{^sc:" : "{sc:";
    out += name + "}";
    i = close;
  }
  return out;
}

// One match data for every pattern (only the whole match is read), per thread.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder holder;
  return holder.md;
}

// PCRE2's limits set explicitly (docs/reliability.md): a pattern from a downloaded tokenizer.json
// that backtracks catastrophically stops after this many match steps (PCRE2's own default), this
// deep a backtracking stack, and this much heap for it (the default would be 20 GB).
// `moe-train --limit regex.NAME=N` changes them (util/input_limits.h).
uint32_t match_limit() { return static_cast<uint32_t>(input_limits().regex_match_steps); }
uint32_t depth_limit() { return static_cast<uint32_t>(input_limits().regex_depth); }
uint32_t heap_limit_kib() { return static_cast<uint32_t>(input_limits().regex_heap_mib * 1024); }

pcre2_match_context* thread_match_context() {
  struct Holder {
    pcre2_match_context* ctx = [] {
      pcre2_match_context* c = pcre2_match_context_create(nullptr);
      pcre2_set_match_limit(c, match_limit());
      pcre2_set_depth_limit(c, depth_limit());
      pcre2_set_heap_limit(c, heap_limit_kib());
      return c;
    }();
    ~Holder() { pcre2_match_context_free(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

}  // namespace

struct HfPreTokenizer::Step {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind = kSplit;
  pcre2_code* regex = nullptr;  // kSplit (or the literal), kByteLevel with use_regex
  std::string literal;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;

  ~Step() { pcre2_code_free(regex); }

  std::string given_pattern, origin;  // for the error a failed match raises

  void compile(const std::string& given, const Refuse& refuse) {
    given_pattern = given;
    const std::string pattern = script_properties_as_oniguruma(given);
    int err = 0;
    PCRE2_SIZE offset = 0;
    regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (regex == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      refuse("the pre-tokenizer regex " + given + " does not compile at offset " +
             std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(regex, PCRE2_JIT_COMPLETE);  // faster when available
  }

  // The pattern's matches in `s` and the gaps between them (tokenizers' find_matches); an empty
  // match only moves the search on by one character.
  std::vector<Span> find_matches(const std::string& s) const {
    std::vector<Span> spans;
    size_t prev = 0, pos = 0;
    auto add = [&](size_t b, size_t e) {
      if (b > prev) spans.push_back({prev, b, false});
      spans.push_back({b, e, true});
      prev = e;
    };
    if (regex == nullptr) {
      for (size_t hit = s.find(literal); !literal.empty() && hit != std::string::npos;
           hit = s.find(literal, prev)) {
        add(hit, hit + literal.size());
      }
    } else {
      pcre2_match_data* md = thread_match_data();
      while (pos < s.size()) {
        // PCRE2_NO_UTF_CHECK: encode() validated the text once; without it every call
        // re-validates the rest of the subject (quadratic in the length of a document).
        const int rc = pcre2_match(regex, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                   PCRE2_NO_UTF_CHECK, md, thread_match_context());
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {  // a limit (input that makes the pattern backtrack), never a crash
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw UserError(
              "tokenizer: " + (origin.empty() ? std::string("tokenizer.json") : origin) +
              ": the pre-tokenizer regex " + given_pattern + " failed on a " +
              std::to_string(s.size()) +
              "-byte piece of text: " + reinterpret_cast<const char*>(msg) +
              " (limits: " + std::to_string(match_limit()) + " match steps, depth " +
              std::to_string(depth_limit()) + ", " + std::to_string(heap_limit_kib() / 1024) +
              " MiB; moe-train --limit regex.match_steps=N, regex.depth=N or regex.heap_mib=N "
              "raises them)");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
          add(ov[0], ov[1]);
          pos = ov[1];
        } else {  // empty: step over one code point
          pos = ov[0] + 1;
          while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        }
      }
    }
    if (prev < s.size()) spans.push_back({prev, s.size(), false});
    return spans;
  }

  void split_by_pattern(const std::string& text, bool at_start, Behavior how, bool inverted,
                        std::vector<std::pair<std::string, bool>>& out) const {
    std::vector<Span> spans = find_matches(text);
    if (inverted) {
      for (Span& s : spans) s.match = !s.match;
    }
    for (const Span& s : apply_behavior(std::move(spans), how)) {
      if (s.end > s.begin)
        out.emplace_back(text.substr(s.begin, s.end - s.begin), at_start && s.begin == 0);
    }
  }

  void apply(std::string text, bool at_start,
             std::vector<std::pair<std::string, bool>>& out) const {
    switch (kind) {
      case kSplit:
        split_by_pattern(text, at_start, behavior, invert, out);
        return;
      case kByteLevel:
        if (add_prefix_space && text[0] != ' ') text.insert(0, " ");
        if (regex != nullptr) {
          split_by_pattern(text, at_start, Behavior::kIsolated, false, out);
        } else {
          out.emplace_back(std::move(text), at_start);
        }
        return;
      case kMetaspace: {
        std::string replaced;
        for (char c : text) {
          if (c == ' ') {
            replaced += replacement;
          } else {
            replaced += c;
          }
        }
        const bool starts = replaced.compare(0, replacement.size(), replacement) == 0;
        if (!starts && (prepend == kAlways || (prepend == kFirst && at_start))) {
          replaced.insert(0, replacement);
        }
        if (split) {
          split_by_pattern(replaced, at_start, Behavior::kMergedWithNext, false, out);
        } else {
          out.emplace_back(std::move(replaced), at_start);
        }
        return;
      }
    }
  }
};

HfPreTokenizer::~HfPreTokenizer() = default;

HfPreTokenizer::HfPreTokenizer(const json& spec, const Refuse& refuse, const std::string& origin) {
  if (spec.is_null()) return;
  const std::string type = spec.value("type", std::string("?"));
  if (type == "Sequence") {
    for (const auto& inner : spec.at("pretokenizers")) {
      if (byte_level_) refuse("a pre-tokenizer step after ByteLevel");
      const bool first = steps_.empty();
      HfPreTokenizer p(inner, refuse, origin);
      // ByteLevel's space after a split goes on pieces, which never span a cut.
      if (p.prefixes_segments_ && (first || !p.byte_level_)) prefixes_segments_ = true;
      steps_.insert(steps_.end(), p.steps_.begin(), p.steps_.end());
      byte_level_ = byte_level_ || p.byte_level_;
    }
    return;
  }
  auto step = std::make_shared<Step>();
  step->origin = origin;
  if (type == "Split") {
    const json& p = spec.at("pattern");
    if (p.contains("Regex")) {
      step->compile(p["Regex"].get<std::string>(), refuse);
    } else if (p.contains("String")) {
      step->literal = p["String"].get<std::string>();
    } else {
      refuse("Split pattern other than Regex or String");
    }
    step->behavior = behavior_named(spec.value("behavior", std::string("Isolated")), refuse);
    step->invert = spec.value("invert", false);
  } else if (type == "ByteLevel") {
    step->kind = Step::kByteLevel;
    step->add_prefix_space = spec.value("add_prefix_space", true);
    if (spec.value("use_regex", true)) step->compile(kGpt2Pattern, refuse);
    byte_level_ = true;
    // ByteLevel alone gets whole segments: its space would be added at every chunk cut.
    prefixes_segments_ = step->add_prefix_space;
  } else if (type == "Digits") {
    step->compile(kNumeric, refuse);
    step->behavior =
        spec.value("individual_digits", false) ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (type == "Punctuation") {
    step->compile(kPunctuation, refuse);
    step->behavior = behavior_named(spec.value("behavior", std::string("Isolated")), refuse);
  } else if (type == "WhitespaceSplit") {
    step->compile(kWhiteSpace, refuse);
    step->behavior = Behavior::kRemoved;
  } else if (type == "Metaspace") {
    step->kind = Step::kMetaspace;
    step->replacement = spec.value("replacement", std::string("\xE2\x96\x81"));
    step->literal = step->replacement;
    step->split = spec.value("split", true);
    const std::string scheme =
        spec.value("prepend_scheme", spec.value("add_prefix_space", true) ? "always" : "never");
    if (scheme == "first") {
      step->prepend = Step::kFirst;
    } else if (scheme == "never") {
      step->prepend = Step::kNever;
    } else if (scheme != "always") {
      refuse("Metaspace prepend_scheme " + scheme);
    }
    prefixes_segments_ = step->prepend != Step::kNever;
  } else {
    refuse("pre_tokenizer " + type + " is not supported");
  }
  steps_.push_back(std::move(step));
}

void HfPreTokenizer::split(const std::string& segment, bool at_text_start,
                           std::vector<std::string>& pieces) const {
  if (segment.empty()) return;
  if (steps_.empty()) {
    pieces.push_back(segment);
    return;
  }
  std::vector<std::pair<std::string, bool>> current{{segment, at_text_start}}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (auto& [text, at_start] : current) step->apply(std::move(text), at_start, next);
    current.swap(next);
  }
  for (auto& [text, at_start] : current) pieces.push_back(std::move(text));
}

}  // namespace moe::tokenizers
