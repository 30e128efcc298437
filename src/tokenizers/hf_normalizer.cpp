#include "moe/tokenizers/hf_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>

#include "moe/tokenizers/utf8.h"

namespace moe::tokenizers {

namespace {

using nlohmann::json;

// `tokenizers` normalizes with the unicode-normalization-alignments crate, whose tables predate
// Unicode 12.1: it leaves U+32FF (12.1) and U+11938 (13.0) alone, and matches Python's
// unicodedata (Unicode 14) on every other code point. ICU 72 is at Unicode 15, so its
// normalizers are filtered to the code points assigned by 12.0; others pass through unchanged
// and, like the crate's unknown code points, are starters that nothing composes with.
constexpr const char* kUnicodeVersionFilter = "[:age=12.0:]";

const icu::Normalizer2* unicode_form(const std::string& type) {
  static std::mutex mutex;
  static std::unique_ptr<icu::UnicodeSet> assigned;
  static std::unique_ptr<icu::FilteredNormalizer2> forms[4];
  static const char* const names[4] = {"NFC", "NFD", "NFKC", "NFKD"};
  const auto at = std::find(std::begin(names), std::end(names), type) - std::begin(names);
  if (at == 4) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  UErrorCode status = U_ZERO_ERROR;
  if (!assigned) {
    assigned = std::make_unique<icu::UnicodeSet>(
        icu::UnicodeString::fromUTF8(kUnicodeVersionFilter), status);
    assigned->freeze();
  }
  if (!forms[at]) {
    const icu::Normalizer2* base = at == 0   ? icu::Normalizer2::getNFCInstance(status)
                                   : at == 1 ? icu::Normalizer2::getNFDInstance(status)
                                   : at == 2 ? icu::Normalizer2::getNFKCInstance(status)
                                             : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status)) return nullptr;
    forms[at] = std::make_unique<icu::FilteredNormalizer2>(*base, *assigned);
  }
  return U_FAILURE(status) ? nullptr : forms[at].get();
}

// Rust's char::to_lowercase, code point by code point (full mappings such as U+0130 -> "i̇", but
// no context: `tokenizers` lowercases each char alone, so a final capital sigma becomes σ).
std::string lowercase(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0, n = 0; i < text.size(); i += n) {
    const uint32_t cp = utf8::decode(text, i, n);
    if (cp < 0x80) {
      out += static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
      continue;
    }
    UChar src[2], dst[8];
    int32_t len = 0;
    U16_APPEND_UNSAFE(src, len, cp);
    UErrorCode status = U_ZERO_ERROR;
    const int32_t m = u_strToLower(dst, 8, src, len, "", &status);
    if (U_FAILURE(status)) {
      out.append(text, i, n);
      continue;
    }
    for (int32_t k = 0; k < m;) {
      UChar32 c;
      U16_NEXT_UNSAFE(dst, k, c);
      utf8::append(out, static_cast<uint32_t>(c));
    }
  }
  return out;
}

std::string strip(const std::string& text, bool left, bool right) {
  size_t begin = 0, end = text.size(), n = 0;
  while (left && begin < end && utf8::is_white_space(utf8::decode(text, begin, n))) begin += n;
  while (right && end > begin) {
    const size_t prev = utf8::previous(text, end);
    if (!utf8::is_white_space(utf8::decode(text, prev, n))) break;
    end = prev;
  }
  return text.substr(begin, end - begin);
}

std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit = text.find(from); hit != std::string::npos; hit = text.find(from, at)) {
    out.append(text, at, hit - at).append(to);
    at = hit + from.size();
  }
  out.append(text, at, std::string::npos);
  return out;
}

}  // namespace

HfNormalizer::HfNormalizer(const json& spec, const Refuse& refuse) {
  if (spec.is_null()) return;
  const std::string type = spec.value("type", std::string("?"));
  if (type == "Sequence") {
    for (const auto& step : spec.at("normalizers")) {
      HfNormalizer inner(step, refuse);
      steps_.insert(steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
  } else if (const icu::Normalizer2* form = unicode_form(type)) {
    steps_.push_back({Step::kUnicodeForm, "", "", false, false, form});
  } else if (type == "Prepend") {
    steps_.push_back({Step::kPrepend, spec.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    const json& p = spec.at("pattern");
    if (!p.contains("String")) refuse("normalizer Replace with a Regex pattern");
    const std::string from = p["String"].get<std::string>();
    if (from.empty()) refuse("normalizer Replace of an empty string");
    steps_.push_back({Step::kReplace, from, spec.at("content").get<std::string>()});
  } else if (type == "Lowercase") {
    steps_.push_back({Step::kLowercase, "", ""});
  } else if (type == "Strip") {
    steps_.push_back(
        {Step::kStrip, "", "", spec.value("strip_left", true), spec.value("strip_right", true)});
  } else {
    refuse("normalizer " + type + " is not supported");
  }
}

bool HfNormalizer::depends_on_ends() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const Step& s) {
    return s.kind == Step::kPrepend || s.kind == Step::kStrip;
  });
}

std::string HfNormalizer::apply(std::string text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::kUnicodeForm: {
        const auto* form = static_cast<const icu::Normalizer2*>(step.form);
        UErrorCode status = U_ZERO_ERROR;
        if (form->isNormalizedUTF8(text, status) && U_SUCCESS(status)) break;
        status = U_ZERO_ERROR;
        std::string out;
        icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
        form->normalizeUTF8(0, text, sink, nullptr, status);
        if (U_FAILURE(status)) {
          throw std::runtime_error(std::string("tokenizer: Unicode normalization failed: ") +
                                   u_errorName(status));
        }
        text = std::move(out);
        break;
      }
      case Step::kPrepend:
        if (!text.empty()) text.insert(0, step.from);
        break;
      case Step::kReplace:
        text = replace_all(text, step.from, step.to);
        break;
      case Step::kLowercase:
        text = lowercase(text);
        break;
      case Step::kStrip:
        text = strip(text, step.left, step.right);
        break;
    }
  }
  return text;
}

}  // namespace moe::tokenizers
