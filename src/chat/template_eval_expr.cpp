#include <algorithm>
#include <cmath>
#include <limits>

#include "template_builtins.h"
#include "template_eval.h"
#include "template_values.h"

namespace moe::chat {

namespace {

// `needle in haystack`: a substring, a list item or a mapping's key.
bool contains(const Value& haystack, const Value& needle) {
  const Json& b = haystack.v;
  if (b.is_string()) return b.get<std::string>().find(to_text(needle)) != std::string::npos;
  if (b.is_array()) return std::find(b.begin(), b.end(), needle.v) != b.end();
  if (b.is_object()) return needle.v.is_string() && b.contains(needle.v.get<std::string>());
  return false;
}

}  // namespace

// ---- expressions ----
Value Renderer::eval(const Expr& e, int line) {
  NestingGuard guard(
      render_depth_, [&] { too_deep(line); }, max_render_depth());
  return eval_node(e, line);
}

Value Renderer::eval_node(const Expr& e, int line) {
  switch (e.kind) {
    case Expr::kLiteral:
      return e.name == "undefined" ? Value::undef() : Value{e.literal, false};
    case Expr::kName:
      return lookup(e.name);
    case Expr::kList: {
      Json a = Json::array();
      for (const auto& x : e.args) a.push_back(eval(*x, line).v);
      charge_built(a, line);
      return {a, false};
    }
    case Expr::kDict: {
      Json o = Json::object();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        o[to_text(eval(*e.args[i], line))] = eval(*e.args[i + 1], line).v;
      }
      charge_built(o, line);
      return {o, false};
    }
    case Expr::kAttr:
      return attribute(eval(*e.args[0], line), e.name);
    case Expr::kIndex:
      return index(eval(*e.args[0], line), eval(*e.args[1], line), line);
    case Expr::kSlice:
      return slice(e, line);
    case Expr::kCall:
      return call(e, line);
    case Expr::kFilter:
      return filter(e, line);
    case Expr::kTest: {
      const bool r = test(e, line);
      return {Json(e.negated ? !r : r), false};
    }
    case Expr::kNot:
      return {Json(!truthy(eval(*e.args[0], line))), false};
    case Expr::kNeg: {
      const Value v = eval(*e.args[0], line);
      if (v.v.is_number_integer()) {
        const int64_t i = v.v.get<int64_t>();
        if (i == std::numeric_limits<int64_t>::min()) fail(line, "integer beyond 64 bits");
        return {Json(-i), false};
      }
      if (v.v.is_number()) return {Json(-v.v.get<double>()), false};
      fail(line, "unary minus of a non-number");
    }
    case Expr::kBinary:
      return binary(e, line);
    case Expr::kTernary:
      return truthy(eval(*e.args[0], line)) ? eval(*e.args[1], line) : eval(*e.args[2], line);
  }
  return Value::undef();
}

Value Renderer::index(const Value& obj, const Value& key, int line) {
  if (obj.v.is_object()) {
    if (!key.v.is_string()) return Value::undef();
    return attribute(obj, key.v.get<std::string>());
  }
  if ((obj.v.is_array() || obj.v.is_string()) && key.v.is_number_integer()) {
    int64_t i = key.v.get<int64_t>();
    if (obj.v.is_string()) {
      const auto cps = code_points(obj.v.get<std::string>());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) fail(line, "string index out of range");
      return {Json(from_code_points({cps[static_cast<size_t>(i)]})), false};
    }
    const auto n = static_cast<int64_t>(obj.v.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undef();
    return {obj.v[static_cast<size_t>(i)], false};
  }
  return Value::undef();
}

Value Renderer::slice(const Expr& e, int line) {
  const Value obj = eval(*e.args[0], line);
  auto bound = [&](int k) -> std::optional<int64_t> {
    if (!e.args[static_cast<size_t>(k)]) return std::nullopt;
    const Value v = eval(*e.args[static_cast<size_t>(k)], line);
    if (v.v.is_null() || v.undefined) return std::nullopt;
    if (!v.v.is_number_integer()) fail(line, "a slice bound that is not an integer");
    return v.v.get<int64_t>();
  };
  const auto start = bound(1), stop = bound(2), step_given = bound(3);
  const int64_t step = step_given.value_or(1);
  if (step == 0) fail(line, "slice step cannot be zero");
  std::vector<Json> items;
  const bool is_string = obj.v.is_string();
  if (is_string) {
    for (uint32_t c : code_points(obj.v.get<std::string>())) items.emplace_back(c);
  } else if (obj.v.is_array()) {
    items.assign(obj.v.begin(), obj.v.end());
  } else {
    fail(line, "slicing something that is not a list or string");
  }
  // Python's slice.indices().
  const auto n = static_cast<int64_t>(items.size());
  auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
    if (!b) return dflt;
    int64_t v = *b < 0 ? *b + n : *b;
    return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t from = clamp(start, step > 0 ? 0 : n - 1), to = clamp(stop, step > 0 ? n : -1);
  Json out = Json::array();
  std::vector<uint32_t> cps;
  for (int64_t i = from; step > 0 ? i < to : i > to; i += step) {
    if (is_string) {
      cps.push_back(items[static_cast<size_t>(i)].get<uint32_t>());
    } else {
      out.push_back(items[static_cast<size_t>(i)]);
    }
  }
  return is_string ? Value{Json(from_code_points(cps)), false} : Value{out, false};
}

std::vector<Value> Renderer::arguments(const Expr& e, int line, size_t first) {
  std::vector<Value> a;
  for (size_t i = first; i < e.args.size(); ++i) a.push_back(eval(*e.args[i], line));
  return a;
}

Value Renderer::kwarg(const Expr& e, const std::string& key, int line) {
  for (const auto& [k, x] : e.kwargs) {
    if (k == key) return eval(*x, line);
  }
  return Value::undef();
}

Value Renderer::call(const Expr& e, int line) {
  const Expr& callee = *e.args[0];
  std::vector<Value> a = arguments(e, line, 1);
  if (callee.kind == Expr::kName) {
    const Value f = lookup(callee.name);
    if (is_macro(f.v)) return call_macro(f.v, std::move(a), e, line);
    if (const Function builtin = find_function(callee.name)) {
      return builtin(*this, callee.name, a, e, line);
    }
    fail(line, "unknown function " + callee.name + "()");
  }
  if (callee.kind != Expr::kAttr) fail(line, "a call of something that is not a function");
  if (callee.name == "append" || callee.name == "pop") {
    if (Json* list = mutable_list(*callee.args[0])) return mutate_list(*list, callee.name, a, line);
  }
  return call_method(*this, eval(*callee.args[0], line), callee.name, a, line);
}

// The list a variable or a namespace attribute holds, to change in place (Kimi-K2's template
// queues tool-call ids with `ns.ids.append(id)` and takes them with `ns.ids.pop(0)`); nullptr for
// anything else.
Json* Renderer::mutable_list(const Expr& e) {
  Json* target = nullptr;
  if (e.kind == Expr::kName) target = find_variable(e.name);
  if (e.kind == Expr::kAttr && e.args[0]->kind == Expr::kName) {
    Json* ns = find_variable(e.args[0]->name);
    if (ns != nullptr && ns->is_object() && ns->contains(e.name)) target = &(*ns)[e.name];
  }
  return target != nullptr && target->is_array() ? target : nullptr;
}

// list.append(x) (None) and list.pop([i]) (the item), as Python does them.
Value Renderer::mutate_list(Json& list, const std::string& method, const std::vector<Value>& a,
                            int line) {
  if (method == "append") {
    if (a.size() != 1) fail(line, "append() takes one argument");
    list.push_back(a[0].v);
    charge_built(Json::array({a[0].v}), line);  // the item and its slot, not the list again
    return {Json(), false};
  }
  if (a.size() > 1 || (a.size() == 1 && !a[0].v.is_number_integer())) {
    fail(line, "pop() takes one integer index");
  }
  const int64_t n = static_cast<int64_t>(list.size());
  int64_t i = a.empty() ? -1 : a[0].v.get<int64_t>();
  if (i < 0) i += n;
  if (i < 0 || i >= n) fail(line, "pop index out of range");
  Json item = list[static_cast<size_t>(i)];
  list.erase(list.begin() + i);
  return {item, false};
}

Value Renderer::filter(const Expr& e, int line) {
  const Value x = eval(*e.args[0], line);
  const std::vector<Value> a = arguments(e, line, 1);
  const Filter f = find_filter(e.name);
  if (f == nullptr) fail(line, "unsupported filter |" + e.name);
  return f(*this, e.name, x, a, e, line);
}

bool Renderer::test(const Expr& e, int line) {
  const Value x = eval(*e.args[0], line);
  const std::string& t = e.name;
  // Undefined passes none but these (not even a test of an unknown name).
  if (x.undefined && t != "defined" && t != "undefined" && t != "none") return false;
  const Test passes = find_test(t);
  if (passes == nullptr) fail(line, "unsupported test 'is " + t + "'");
  return passes(*this, t, x, e, line);
}

Value Renderer::binary(const Expr& e, int line) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = eval(*e.args[0], line);
    return truthy(a) ? eval(*e.args[1], line) : a;
  }
  if (op == "or") {
    Value a = eval(*e.args[0], line);
    return truthy(a) ? a : eval(*e.args[1], line);
  }
  const Value a = eval(*e.args[0], line), b = eval(*e.args[1], line);
  if (std::optional<Value> r = compare_or_concatenate(op, a, b, line)) return *r;
  if (!a.v.is_number() || !b.v.is_number()) return repeat_string(op, a, b, line);
  return arithmetic(op, a, b, line);
}

// ~, == and !=, in and not in, and + on two strings or two lists; none for other operators.
std::optional<Value> Renderer::compare_or_concatenate(const std::string& op, const Value& a,
                                                      const Value& b, int line) {
  if (op == "~") {
    std::string joined = to_text(a) + to_text(b);
    check_size(joined.size(), line);
    return Value{Json(std::move(joined)), false};
  }
  if (op == "==" || op == "!=") {
    const bool eq = a.undefined || b.undefined ? (a.undefined && b.undefined) : a.v == b.v;
    return Value{Json(op == "==" ? eq : !eq), false};
  }
  if (op == "in" || op == "not in") {
    const bool found = contains(b, a);
    return Value{Json(op == "in" ? found : !found), false};
  }
  if (op == "+" && a.v.is_string() && b.v.is_string()) {
    check_size(a.v.get_ref<const std::string&>().size() + b.v.get_ref<const std::string&>().size(),
               line);
    return Value{Json(a.v.get<std::string>() + b.v.get<std::string>()), false};
  }
  if (op == "+" && a.v.is_array() && b.v.is_array()) {
    Json out = a.v;
    for (const auto& x : b.v) out.push_back(x);
    charge_built(out, line);
    return Value{out, false};
  }
  return std::nullopt;
}

// An operator with an operand that is not a number: only string * integer is defined.
Value Renderer::repeat_string(const std::string& op, const Value& a, const Value& b,
                              int line) const {
  if (op == "*" && a.v.is_string() && b.v.is_number_integer()) {
    const double bytes = static_cast<double>(a.v.get_ref<const std::string&>().size()) *
                         static_cast<double>(std::max<int64_t>(0, b.v.get<int64_t>()));
    check_size(bytes > static_cast<double>(max_text_bytes()) ? max_text_bytes() + 1
                                                             : static_cast<size_t>(bytes),
               line);
    std::string out;
    for (int64_t i = 0; i < b.v.get<int64_t>(); ++i) out += a.v.get<std::string>();
    return {Json(out), false};
  }
  fail(line, "operator " + op + " on " + (a.undefined ? "undefined" : a.v.type_name()) + " and " +
                 (b.undefined ? "undefined" : b.v.type_name()));
}

// Comparisons and arithmetic on two numbers: integer arithmetic when both are integers.
Value Renderer::arithmetic(const std::string& op, const Value& a, const Value& b, int line) const {
  const double x = a.v.get<double>(), y = b.v.get<double>();
  if (op == "<") return {Json(x < y), false};
  if (op == ">") return {Json(x > y), false};
  if (op == "<=") return {Json(x <= y), false};
  if (op == ">=") return {Json(x >= y), false};
  if (a.v.is_number_integer() && b.v.is_number_integer()) {
    if (std::optional<Value> r =
            integer_arithmetic(op, a.v.get<int64_t>(), b.v.get<int64_t>(), line)) {
      return *r;
    }
  }
  if (op == "+") return {Json(x + y), false};
  if (op == "-") return {Json(x - y), false};
  if (op == "*") return {Json(x * y), false};
  if (y == 0) fail(line, "division by zero");
  if (op == "/") return {Json(x / y), false};
  if (op == "//") return {Json(std::floor(x / y)), false};
  if (op == "%") return {Json(x - y * std::floor(x / y)), false};
  fail(line, "unsupported operator " + op);
}

// + - * // % on two integers (Python's floor division and modulo); none for other operators.
std::optional<Value> Renderer::integer_arithmetic(const std::string& op, int64_t i, int64_t j,
                                                  int line) const {
  // Python's ints are unbounded; here a result past 64 bits is an error.
  int64_t r = 0;
  if ((op == "+" && __builtin_add_overflow(i, j, &r)) ||
      (op == "-" && __builtin_sub_overflow(i, j, &r)) ||
      (op == "*" && __builtin_mul_overflow(i, j, &r)) ||
      ((op == "//" || op == "%") && i == std::numeric_limits<int64_t>::min() && j == -1)) {
    fail(line, "integer " + op + " beyond 64 bits");
  }
  if (op == "+" || op == "-" || op == "*") return Value{Json(r), false};
  if ((op == "//" || op == "%") && j == 0) fail(line, "division by zero");
  if (op == "//") return Value{Json(i / j - (i % j != 0 && (i % j < 0) != (j < 0))), false};
  if (op == "%")
    return Value{Json(i % j != 0 && (i % j < 0) != (j < 0) ? i % j + j : i % j), false};
  return std::nullopt;
}

}  // namespace moe::chat
