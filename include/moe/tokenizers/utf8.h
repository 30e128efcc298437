// Small UTF-8 helpers shared by the Hugging Face tokenizer's normalizer, pre-tokenizer and BPE
// model. Input is valid UTF-8 (encode() validates it once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe::tokenizers::utf8 {

// The byte length of the code point whose lead byte is `lead`.
inline size_t length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// The code point at `at` (a lead byte); sets `len` to its byte length.
inline uint32_t decode(std::string_view s, size_t at, size_t& len) {
  const auto c = static_cast<unsigned char>(s[at]);
  len = length(c);
  if (len == 1) return c;
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[at + i]) & 0x3F);
  return cp;
}

inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode White_Space (Rust's char::is_whitespace, which `tokenizers` uses).
inline bool is_white_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The lead byte of the code point that ends just before `at` (> 0).
inline size_t previous(std::string_view s, size_t at) {
  size_t i = at - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace moe::tokenizers::utf8
