// --invalid-utf8 replace against Python's bytes.decode("utf-8", errors="replace") (expected
// strings taken from CPython 3.11), and the ICU-backed normalizers at `tokenizers`' Unicode
// version (tests/tokenizers/hf_tokenizer_families_test.py compares whole pipelines with
// `tokenizers`).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moe/tokenizers/hf_normalizer.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::tokenizers {
namespace {

std::string replaced(std::string s, size_t* count = nullptr) {
  const size_t n = replace_invalid_utf8(s);
  if (count != nullptr) *count = n;
  return s;
}

TEST(ReplaceInvalidUtf8, MaximalSubpartsAsPython) {
  const std::string fffd = "\xEF\xBF\xBD";
  size_t n = 0;
  EXPECT_EQ(replaced("plain ascii, é", &n), "plain ascii, é");
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(replaced("a\xFF"
                     "b",
                     &n),
            "a" + fffd + "b");  // a bad lead byte
  EXPECT_EQ(n, 1u);
  // A truncated sequence is one U+FFFD (b'\xe2\x82 x' -> '\ufffd x').
  EXPECT_EQ(replaced("\xE2\x82 x", &n), fffd + " x");
  EXPECT_EQ(n, 1u);
  // A surrogate: E0..EF's second byte out of range, one per byte (b'\xed\xa0\x80' -> 3).
  EXPECT_EQ(replaced("\xED\xA0\x80", &n), fffd + fffd + fffd);
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(replaced("\xC0\xAF", &n), fffd + fffd);  // overlong: C0 is never a lead byte
  // Above U+10FFFF (F4 90 ...) and a truncated 4-byte sequence at the end.
  EXPECT_EQ(replaced("\xF4\x90\x80\x80", &n), fffd + fffd + fffd + fffd);
  EXPECT_EQ(replaced("ok\xF0\x9F\x98", &n), "ok" + fffd);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(replaced("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");  // valid: untouched
}

std::string normalized(const char* type, const std::string& text) {
  const HfNormalizer n(nlohmann::json{{"type", type}},
                       [](const std::string& what) { throw std::runtime_error(what); });
  return n.apply(text);
}

TEST(HfNormalizer, UnicodeFormsAtTokenizersVersion) {
  EXPECT_EQ(normalized("NFC", "e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(normalized("NFD", "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(normalized("NFKC", "\xEF\xAC\x81"), "fi");       // U+FB01 ligature
  EXPECT_EQ(normalized("NFC", "\xE2\x84\xA6"), "\xCE\xA9");  // Ohm sign -> Omega
  // U+32FF (Unicode 12.1) decomposes in ICU 72 but not in `tokenizers`' tables: left alone.
  EXPECT_EQ(normalized("NFKC", "\xE3\x8B\xBF"), "\xE3\x8B\xBF");
  // Marks reorder by combining class: dot below (220) before circumflex (230).
  EXPECT_EQ(normalized("NFD", "e\xCC\x82\xCC\xA3"), "e\xCC\xA3\xCC\x82");
}

TEST(HfNormalizer, LowercaseAndStripAsTokenizers) {
  // Code point by code point: U+0130 -> "i̇", a final capital sigma -> σ (no context).
  EXPECT_EQ(normalized("Lowercase", "\xC4\xB0X\xCE\xA3"), "i\xCC\x87x\xCF\x83");
  EXPECT_EQ(normalized("Strip", "\xE3\x80\x80 a b\t\n"), "a b");  // U+3000 is white space
}

}  // namespace
}  // namespace moe::tokenizers
