// What a field-list entry (fields.h) can declare besides its key and member: a rule on its
// value. The member's C++ type gives its JSON type. Shared by the walks over the lists
// (reading, checking, writing, describing).
#pragma once

#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/choices.h"
#include "moe/config/config.h"

namespace moe::config {

// validate() reports a value the rule rejects as "path = value: <describe()>".
struct Rule {
  enum class Kind { kNone, kRange, kNotEmpty, kOneOf };
  Kind kind = Kind::kNone;
  std::optional<double> lo{}, hi{};
  bool lo_open = false, hi_open = false;
  std::string_view note{};                      // appended in parentheses: "0 = off"
  std::string_view text{};                      // said instead of the text made from the bounds
  std::span<const std::string_view> options{};  // kOneOf

  constexpr Rule says(std::string_view t) const {
    Rule r = *this;
    r.text = t;
    return r;
  }

  template <class T>
  bool allows(const T& v) const {
    if constexpr (std::is_arithmetic_v<T>) {
      const double d = static_cast<double>(v);
      return !((lo && (lo_open ? d <= *lo : d < *lo)) || (hi && (hi_open ? d >= *hi : d > *hi)));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (kind == Kind::kNotEmpty) return !v.empty();
      if (kind == Kind::kOneOf) {
        for (std::string_view o : options) {
          if (v == o) return true;
        }
        return false;
      }
      return true;
    } else {
      return true;
    }
  }

  std::string describe() const {
    if (!text.empty()) return std::string(text);
    std::string s;
    if (kind == Kind::kOneOf) {
      for (std::string_view o : options) s += (s.empty() ? "" : ", ") + std::string(o);
      return "expected one of " + s;
    }
    if (lo && hi) {
      s = "must be in " + std::string(lo_open ? "(" : "[") + number(*lo) + ", " + number(*hi) +
          (hi_open ? ")" : "]");
    } else if (lo) {
      s = std::string("must be ") + (lo_open ? "> " : ">= ") + number(*lo);
    } else if (hi) {
      s = std::string("must be ") + (hi_open ? "< " : "<= ") + number(*hi);
    }
    if (!note.empty()) s += " (" + std::string(note) + ")";
    return s;
  }

 private:
  static std::string number(double d) {
    if (d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(int64_t(d));
    return nlohmann::json(d).dump();
  }
};

constexpr Rule above(double lo, std::string_view note = {}) {
  return {.kind = Rule::Kind::kRange, .lo = lo, .lo_open = true, .note = note};
}
constexpr Rule at_least(double lo, std::string_view note = {}) {
  return {.kind = Rule::Kind::kRange, .lo = lo, .note = note};
}
constexpr Rule in(double lo, double hi, std::string_view note = {}) {  // [lo, hi]
  return {.kind = Rule::Kind::kRange, .lo = lo, .hi = hi, .note = note};
}
constexpr Rule in_open(double lo, double hi, std::string_view note = {}) {  // [lo, hi)
  return {.kind = Rule::Kind::kRange, .lo = lo, .hi = hi, .hi_open = true, .note = note};
}
constexpr Rule not_empty(std::string_view text) {
  return {.kind = Rule::Kind::kNotEmpty, .text = text};
}
constexpr Rule one_of(std::span<const std::string_view> options) {
  return {.kind = Rule::Kind::kOneOf, .options = options};
}

// data.blend entries as JSON (found by nlohmann through ADL).
inline void to_json(nlohmann::json& j, const BlendSource& b) {
  j = {{"name", b.name}, {"path", b.path}, {"weight", b.weight}};
  if (!b.valid_path.empty()) j["valid_path"] = b.valid_path;
}

// The JSON value of a member: closed-set choices by name.
template <class T>
nlohmann::json json_value(const T& v) {
  if constexpr (Choice<T>) {
    return std::string(name(v));
  } else {
    return v;
  }
}

// The JSON Schema type of a member type.
template <class T>
std::string json_type() {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return "integer";
  if constexpr (std::is_floating_point_v<T>) return "number";
  if constexpr (std::is_same_v<T, std::string> || Choice<T>) return "string";
  if constexpr (std::is_same_v<T, std::array<double, 2>> ||
                std::is_same_v<T, std::vector<int64_t>> ||
                std::is_same_v<T, std::vector<std::string>> ||
                std::is_same_v<T, std::vector<BlendSource>>)
    return "array";
  return "";
}

// The JSON Schema type of an array member's items; "" for other members.
template <class T>
std::string json_item_type() {
  if constexpr (std::is_same_v<T, std::array<double, 2>>) return "number";
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "integer";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "string";
  if constexpr (std::is_same_v<T, std::vector<BlendSource>>) return "object";
  return "";
}

// Dotted JSON paths of the objects a walk is inside.
class PathStack {
 public:
  std::string of(std::string_view key) const {
    return parts_.empty() ? std::string(key) : parts_.back() + "." + std::string(key);
  }
  void push(std::string_view key) { parts_.push_back(of(key)); }
  void pop() { parts_.pop_back(); }

 private:
  std::vector<std::string> parts_;
};

}  // namespace moe::config
