#include <cctype>
#include <optional>
#include <unordered_map>

#include "moe/tokenizers/utf8.h"
#include "template_builtins.h"
#include "template_eval.h"
#include "template_values.h"

namespace moe::chat {

namespace utf8 = tokenizers::utf8;

namespace {

// Methods of strings and of mappings: the name called, the receiver, the arguments.
using StringMethod = Value (*)(const std::string& name, const std::string& s, const Args& a);
using ObjectMethod = Value (*)(const std::string& name, const Value& obj, const Args& a);

// Argument i as text; empty when absent or None.
std::string text_arg(const std::vector<Value>& a, size_t i) {
  return i < a.size() && !a[i].v.is_null() ? to_text(a[i]) : std::string();
}

// The first argument as text; none when absent or None.
std::optional<std::string> optional_text_arg(const std::vector<Value>& a) {
  return a.empty() || a[0].v.is_null() ? std::optional<std::string>() : text_arg(a, 0);
}

std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  auto strippable = [&](uint32_t c) {
    if (!chars) return utf8::is_white_space(c);
    for (uint32_t k : code_points(*chars)) {
      if (k == c) return true;
    }
    return false;
  };
  std::vector<uint32_t> cps = code_points(s);
  size_t b = 0, e = cps.size();
  while (left && b < e && strippable(cps[b])) ++b;
  while (right && e > b && strippable(cps[e - 1])) --e;
  return from_code_points(
      {cps.begin() + static_cast<std::ptrdiff_t>(b), cps.begin() + static_cast<std::ptrdiff_t>(e)});
}

Json split(const std::string& s, const std::optional<std::string>& sep, int64_t max) {
  Json out = Json::array();
  if (sep && !sep->empty()) {
    size_t at = 0;
    for (size_t hit = s.find(*sep);
         hit != std::string::npos && (max < 0 || static_cast<int64_t>(out.size()) < max);
         hit = s.find(*sep, at)) {
      out.push_back(s.substr(at, hit - at));
      at = hit + sep->size();
    }
    out.push_back(s.substr(at));
    return out;
  }
  std::string word;  // Python's split(): runs of white space, none at the ends
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    const uint32_t c = utf8::decode(s, i, n);
    if (utf8::is_white_space(c)) {
      if (!word.empty()) out.push_back(word);
      word.clear();
    } else {
      word.append(s, i, n);
    }
  }
  if (!word.empty()) out.push_back(word);
  return out;
}

// startswith / endswith, with one affix or a list of them.
Value string_affix(const std::string& name, const std::string& s, const std::vector<Value>& a) {
  std::vector<std::string> options;
  if (!a.empty() && a[0].v.is_array()) {
    for (const auto& o : a[0].v) options.push_back(o.get<std::string>());
  } else {
    options.push_back(text_arg(a, 0));
  }
  for (const auto& o : options) {
    const bool hit = name == "startswith"
                         ? s.compare(0, o.size(), o) == 0
                         : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
    if (hit) return {Json(true), false};
  }
  return {Json(false), false};
}

Value string_strip(const std::string& name, const std::string& s, const std::vector<Value>& a) {
  return {Json(strip(s, optional_text_arg(a), name != "rstrip", name != "lstrip")), false};
}

Value string_split(const std::string&, const std::string& s, const std::vector<Value>& a) {
  return {split(s, optional_text_arg(a), a.size() > 1 ? a[1].v.get<int64_t>() : -1), false};
}

// upper / lower: ASCII letters only, as before.
Value string_case(const std::string& name, const std::string& s, const std::vector<Value>&) {
  std::string out = s;
  for (char& c : out) {
    if (c >= 'a' && c <= 'z' && name == "upper") c = static_cast<char>(c - 32);
    if (c >= 'A' && c <= 'Z' && name == "lower") c = static_cast<char>(c + 32);
  }
  return {Json(out), false};
}

Value string_replace(const std::string&, const std::string& s, const std::vector<Value>& a) {
  const std::string from = text_arg(a, 0), to = text_arg(a, 1);
  if (from.empty()) return {Json(s), false};
  std::string out;
  size_t at = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  out.append(s, at, std::string::npos);
  return {Json(out), false};
}

// title (every word) / capitalize (the first letter only).
Value string_title(const std::string& name, const std::string& s, const std::vector<Value>&) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha && start)
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    else if (alpha)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    start = name == "title" ? !alpha : false;
  }
  return {Json(out), false};
}

// "{}" placeholders filled in order.
Value string_format(const std::string&, const std::string& s, const std::vector<Value>& a) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "{}") == 0 && next < a.size()) {
      out += to_text(a[next++]);
      ++i;
    } else {
      out += s[i];
    }
  }
  return {Json(out), false};
}

Value object_items(const std::string&, const Value& obj, const std::vector<Value>&) {
  Json out = Json::array();
  for (const auto& [k, x] : obj.v.items()) out.push_back(Json::array({k, x}));
  return {out, false};
}

Value object_keys_or_values(const std::string& name, const Value& obj, const std::vector<Value>&) {
  Json out = Json::array();
  for (const auto& [k, x] : obj.v.items()) out.push_back(name == "keys" ? Json(k) : x);
  return {out, false};
}

Value object_get(const std::string&, const Value& obj, const std::vector<Value>& a) {
  const Value hit = a.empty() ? Value::undef() : attribute(obj, to_text(a[0]));
  return hit.undefined ? (a.size() > 1 ? a[1] : Value{Json(), false}) : hit;
}

}  // namespace

Value call_method(const Renderer& r, const Value& obj, const std::string& name, const Args& a,
                  int line) {
  static const std::unordered_map<std::string_view, StringMethod> string_methods = {
      {"startswith", &string_affix}, {"endswith", &string_affix},   {"strip", &string_strip},
      {"lstrip", &string_strip},     {"rstrip", &string_strip},     {"split", &string_split},
      {"upper", &string_case},       {"lower", &string_case},       {"replace", &string_replace},
      {"title", &string_title},      {"capitalize", &string_title}, {"format", &string_format},
  };
  static const std::unordered_map<std::string_view, ObjectMethod> object_methods = {
      {"items", &object_items},
      {"keys", &object_keys_or_values},
      {"values", &object_keys_or_values},
      {"get", &object_get},
  };
  const Json& v = obj.v;
  if (v.is_string()) {
    const auto hit = string_methods.find(name);
    if (hit != string_methods.end()) return hit->second(name, v.get<std::string>(), a);
  }
  if (v.is_object()) {
    const auto hit = object_methods.find(name);
    if (hit != object_methods.end()) return hit->second(name, obj, a);
  }
  r.fail(line, "unsupported method ." + name + "() on " +
                   (obj.undefined ? "an undefined value" : std::string(v.type_name())));
}

}  // namespace moe::chat
