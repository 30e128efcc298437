#include "template_builtins.h"

#include <cmath>
#include <ctime>
#include <unordered_map>

#include "moe/util/input_limits.h"
#include "template_budget.h"
#include "template_eval.h"
#include "template_values.h"

namespace moe::chat {

namespace {

// ---- global functions ----

Value raise_exception(Renderer& r, const std::string&, const Args& a, const Expr&, int line) {
  r.fail(line, "raise_exception: " + (a.empty() ? std::string() : to_text(a[0])));
}

// namespace(...) and dict(...): a mapping of the keyword arguments.
Value mapping_of_keywords(Renderer& r, const std::string&, const Args&, const Expr& e, int line) {
  Json o = Json::object();
  for (const auto& [k, x] : e.kwargs) o[k] = r.eval(*x, line).v;
  r.charge_built(o, line);
  return {o, false};
}

Value range(Renderer& r, const std::string&, const Args& a, const Expr&, int line) {
  // Integers (Python's bools among them), as Python's range() takes.
  auto integer = [&](const Value& v) -> int64_t {
    if (v.v.is_boolean()) return v.v.get<bool>() ? 1 : 0;
    if (!v.v.is_number_integer()) {
      r.fail(line, std::string("range() of ") + (v.undefined ? "undefined" : v.v.type_name()) +
                       ": expected integers");
    }
    return v.v.get<int64_t>();
  };
  int64_t lo = 0, hi = 0, step = 1;
  if (a.size() == 1) {
    hi = integer(a[0]);
  } else if (a.size() >= 2) {
    lo = integer(a[0]), hi = integer(a[1]);
    if (a.size() > 2) step = integer(a[2]);
  }
  if (step == 0) r.fail(line, "range() step cannot be zero");
  const double items =
      std::ceil((static_cast<double>(hi) - static_cast<double>(lo)) / static_cast<double>(step));
  if (items > static_cast<double>(max_range())) {
    r.fail(line, "range() of " + std::to_string(static_cast<int64_t>(items)) +
                     " items: more than the template sandbox's " + std::to_string(max_range()) +
                     " (Jinja2's MAX_RANGE)" + raise_hint("template.range_items"));
  }
  Json out = Json::array();
  for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.push_back(i);
  return {out, false};
}

Value strftime_now(Renderer&, const std::string&, const Args& a, const Expr&, int) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[128];
  std::strftime(buf, sizeof buf, a.empty() ? "%Y-%m-%d" : to_text(a[0]).c_str(), &tm);
  return {Json(std::string(buf)), false};
}

// ---- tests ----

bool is_defined(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return !x.undefined;
}
bool is_undefined(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.undefined;
}
bool is_none(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return !x.undefined && x.v.is_null();
}
bool is_string(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_string();
}
bool is_number(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_number();
}
bool is_integer(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_number_integer();
}
bool is_float(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_number_float();
}
bool is_boolean(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_boolean();
}
// true / false: the boolean of that name.
bool is_true_or_false(Renderer&, const std::string& t, const Value& x, const Expr&, int) {
  return x.v.is_boolean() && x.v.get<bool>() == (t == "true");
}
bool is_mapping(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_object();
}
// sequence / iterable
bool is_sequence(Renderer&, const std::string&, const Value& x, const Expr&, int) {
  return x.v.is_array() || x.v.is_string() || x.v.is_object();
}
// even / odd: an integer of that parity.
bool is_even_or_odd(Renderer&, const std::string& t, const Value& x, const Expr&, int) {
  return x.v.is_number_integer() && (x.v.get<int64_t>() % 2 == 0) == (t == "even");
}
// equalto / eq / sameas: equal to the test's argument.
bool is_equal(Renderer& r, const std::string& t, const Value& x, const Expr& e, int line) {
  if (e.args.size() < 2) r.fail(line, "test " + t + " needs a value");
  return x.v == r.eval(*e.args[1], line).v;
}

}  // namespace

Function find_function(std::string_view name) {
  static const std::unordered_map<std::string_view, Function> functions = {
      {"raise_exception", &raise_exception}, {"namespace", &mapping_of_keywords},
      {"dict", &mapping_of_keywords},        {"range", &range},
      {"strftime_now", &strftime_now},
  };
  const auto hit = functions.find(name);
  return hit == functions.end() ? nullptr : hit->second;
}

Test find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, Test> tests = {
      {"defined", &is_defined},    {"undefined", &is_undefined},
      {"none", &is_none},          {"string", &is_string},
      {"number", &is_number},      {"integer", &is_integer},
      {"float", &is_float},        {"boolean", &is_boolean},
      {"true", &is_true_or_false}, {"false", &is_true_or_false},
      {"mapping", &is_mapping},    {"sequence", &is_sequence},
      {"iterable", &is_sequence},  {"even", &is_even_or_odd},
      {"odd", &is_even_or_odd},    {"equalto", &is_equal},
      {"eq", &is_equal},           {"sameas", &is_equal},
  };
  const auto hit = tests.find(name);
  return hit == tests.end() ? nullptr : hit->second;
}

}  // namespace moe::chat
