#include "template_values.h"

#include <cmath>
#include <cstdio>

#include <unicode/uchar.h>

#include "moe/tokenizers/utf8.h"

namespace moe::chat {

namespace utf8 = tokenizers::utf8;

namespace {

// Whether Python's str.isprintable() holds for code point c: all but the categories Cc, Cf, Cs,
// Co, Cn, Zl, Zp and Zs (the space U+0020 excepted).
bool python_printable(uint32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

void dumps(const Json& v, int indent, int depth, std::string& out) {
  const std::string pad =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string comma = indent >= 0 ? "," : ", ";
  if (v.is_object()) {
    if (v.empty()) {
      out += "{}";
      return;
    }
    out += "{";
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      out += (first ? "" : comma) + pad + Json(k).dump(-1, ' ', false) + ": ";
      dumps(e, indent, depth + 1, out);
      first = false;
    }
    out += close + "}";
  } else if (v.is_array()) {
    if (v.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      out += (i ? comma : "") + pad;
      dumps(v[i], indent, depth + 1, out);
    }
    out += close + "]";
  } else if (v.is_number_float()) {
    out += python_float(v.get<double>());
  } else {
    out += v.dump(-1, ' ', false);
  }
}

}  // namespace

bool truthy(const Value& x) {
  if (x.undefined) return false;
  const Json& v = x.v;
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    // A sequence cut short (text that is not UTF-8): its bytes, never past the end.
    if (i + utf8::length(static_cast<unsigned char>(s[i])) > s.size()) {
      out.push_back(static_cast<unsigned char>(s[i]));
      n = 1;
      continue;
    }
    out.push_back(utf8::decode(s, i, n));
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t c : cps) utf8::append(out, c);
  return out;
}

std::string python_float(double d) {
  if (d == 0.0 && std::signbit(d)) return "-0.0";  // Python keeps the sign: repr(-0.0)
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
    return Json(static_cast<int64_t>(d)).dump() + ".0";
  }
  return Json(d).dump();
}

// repr(s) of a Python str: in single quotes, or double quotes when s has a single quote and no
// double quote; the quote and backslash escaped; \t \n \r; other code points that are not
// printable (python_printable) as \xhh, \uhhhh or \Uhhhhhhhh.
std::string python_str_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  char hex[16];
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    uint32_t c = static_cast<unsigned char>(s[i]);
    n = 1;
    // A sequence cut short (text that is not UTF-8): its byte, as code_points reads it.
    if (c >= 0x80 && i + utf8::length(static_cast<unsigned char>(s[i])) <= s.size()) {
      c = utf8::decode(s, i, n);
    }
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < ' ' || c == 0x7f) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c < 0x7f || python_printable(c)) {
      out.append(s, i, n);
    } else {
      if (c <= 0xff) {
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
      } else if (c <= 0xffff) {
        std::snprintf(hex, sizeof hex, "\\u%04x", c);
      } else {
        std::snprintf(hex, sizeof hex, "\\U%08x", c);
      }
      out += hex;
    }
  }
  return out + q;
}

bool is_macro(const Json& v) { return v.is_binary() && v.get_binary().has_subtype(); }
bool is_unbound(const Json& v) { return v.is_binary() && !v.get_binary().has_subtype(); }
std::string macro_name(const Json& v) {
  const auto& bytes = v.get_binary();
  return std::string(bytes.begin(), bytes.end());
}

std::string to_text(const Value& x) {
  if (x.undefined) return "";
  const Json& v = x.v;
  if (v.is_binary()) return is_macro(v) ? "<Macro '" + macro_name(v) + "'>" : "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return python_float(v.get<double>());
  if (v.is_number()) return v.dump();
  return python_repr(v);
}

std::string python_repr(const Json& v) {
  if (v.is_string()) return python_str_repr(v.get_ref<const std::string&>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      out += (first ? "" : ", ") + python_repr(Json(k)) + ": " + python_repr(e);
      first = false;
    }
    return out + "}";
  }
  return to_text({v, false});
}

Value attribute(const Value& obj, const std::string& name) {
  if (obj.v.is_object()) {
    auto hit = obj.v.find(name);
    if (hit != obj.v.end()) return {*hit, false};
  }
  return Value::undef();
}

std::string python_json_dumps(const Json& value, int indent) {
  std::string out;
  dumps(value, indent, 0, out);
  return out;
}

}  // namespace moe::chat
