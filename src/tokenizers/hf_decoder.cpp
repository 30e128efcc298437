#include "moe/tokenizers/hf_decoder.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "moe/tokenizers/tokenizer.h"
#include "moe/tokenizers/utf8.h"

namespace moe::tokenizers {

std::array<std::string, 256> gpt2_byte_to_unicode() {
  std::array<std::string, 256> out;
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    utf8::append(out[b], printable ? b : 256 + n++);
  }
  return out;
}

namespace {

using json = nlohmann::json;

// gpt2_byte_to_unicode's strings -> their byte.
const std::unordered_map<std::string, unsigned char>& unicode_bytes() {
  static const auto table = [] {
    std::unordered_map<std::string, unsigned char> t;
    const auto chars = gpt2_byte_to_unicode();
    for (size_t b = 0; b < chars.size(); ++b) t.emplace(chars[b], static_cast<unsigned char>(b));
    return t;
  }();
  return table;
}

// ByteLevel: each token's characters back to bytes (a token with a character outside the table
// stays as its own UTF-8), all tokens as one text.
std::string byte_level(const std::vector<std::string>& tokens) {
  const auto& table = unicode_bytes();
  std::string out;
  for (const auto& t : tokens) {
    std::string bytes;
    bool mapped = true;
    for (size_t i = 0; i < t.size() && mapped;) {
      const size_t n =
          std::min<size_t>(utf8::length(static_cast<unsigned char>(t[i])), t.size() - i);
      const auto it = table.find(t.substr(i, n));
      mapped = it != table.end();
      if (mapped) bytes.push_back(static_cast<char>(it->second));
      i += n;
    }
    out += mapped ? bytes : t;
  }
  replace_invalid_utf8(out);
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// ByteFallback: runs of <0xHH> tokens become their bytes when those are UTF-8, else one U+FFFD
// per byte token (tokenizers' ByteFallback).
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (first_invalid_utf8(run) == std::string::npos) {
      out.push_back(run);
    } else {
      for (size_t i = 0; i < run_tokens; ++i) out.push_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_tokens = 0;
  };
  for (const auto& t : tokens) {
    const bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                         hex_digit(t[3]) >= 0 && hex_digit(t[4]) >= 0;
    if (!is_byte) {
      flush();
      out.push_back(t);
      continue;
    }
    run.push_back(static_cast<char>(hex_digit(t[3]) * 16 + hex_digit(t[4])));
    ++run_tokens;
  }
  flush();
  return out;
}

void replace_in_place(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// Strip: up to `start` leading and `stop` trailing copies of `content` (one character).
std::string strip_copies(std::string t, const std::string& content, size_t start, size_t stop) {
  for (size_t i = 0; i < start && t.compare(0, content.size(), content) == 0; ++i)
    t.erase(0, content.size());
  for (size_t i = 0; i < stop && t.size() >= content.size() &&
                     t.compare(t.size() - content.size(), content.size(), content) == 0;
       ++i) {
    t.erase(t.size() - content.size());
  }
  return t;
}

}  // namespace

HfDecoder::HfDecoder(const json& spec) {
  if (spec.is_null()) return;
  none_ = false;
  add(spec);
}

void HfDecoder::add(const json& spec) {
  const std::string type = spec.value("type", std::string());
  Step s{Step::kFuse, "", "", 0, 0, false};
  if (type == "Sequence") {
    for (const auto& d : spec.value("decoders", json::array())) add(d);
    return;
  }
  if (type == "ByteLevel") {
    s.kind = Step::kByteLevel;
  } else if (type == "Replace" && spec.contains("pattern") && spec["pattern"].contains("String")) {
    s.kind = Step::kReplace;
    s.from = spec["pattern"]["String"].get<std::string>();
    s.to = spec.value("content", std::string());
  } else if (type == "ByteFallback") {
    s.kind = Step::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = Step::kFuse;
  } else if (type == "Strip") {
    s.kind = Step::kStrip;
    s.from = spec.value("content", std::string(" "));
    s.start = spec.value("start", size_t{0});
    s.stop = spec.value("stop", size_t{0});
  } else if (type == "Metaspace") {
    s.kind = Step::kMetaspace;
    s.from = spec.value("replacement", std::string("\xE2\x96\x81"));
    s.strip_first_space = spec.value("prepend_scheme", std::string("always")) != "never" &&
                          spec.value("add_prefix_space", true);
  } else {
    if (unsupported_.empty()) unsupported_ = "decoder type " + (type.empty() ? "?" : type);
    return;
  }
  steps_.push_back(std::move(s));
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  if (none_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::kByteLevel:
        tokens = {byte_level(tokens)};
        break;
      case Step::kReplace:
        for (auto& t : tokens) replace_in_place(t, s.from, s.to);
        break;
      case Step::kByteFallback:
        tokens = byte_fallback(tokens);
        break;
      case Step::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case Step::kStrip:
        for (auto& t : tokens) t = strip_copies(t, s.from, s.start, s.stop);
        break;
      case Step::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          replace_in_place(tokens[i], s.from, " ");
          if (i == 0 && s.strip_first_space && !tokens[i].empty() && tokens[i][0] == ' ')
            tokens[i].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  replace_invalid_utf8(out);
  return out;
}

}  // namespace moe::tokenizers
