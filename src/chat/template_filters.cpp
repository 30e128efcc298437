#include <algorithm>
#include <cmath>
#include <exception>
#include <unordered_map>

#include "template_builtins.h"
#include "template_eval.h"
#include "template_values.h"

namespace moe::chat {

namespace {

Value filter_length(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                    const Expr&, int) {
  if (x.v.is_string())
    return {Json(static_cast<int64_t>(code_points(x.v.get<std::string>()).size())), false};
  return {Json(static_cast<int64_t>(x.undefined || x.v.is_null() ? 0 : x.v.size())), false};
}

Value filter_tojson(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                    const Expr& e, int line) {
  Value indent = r.kwarg(e, "indent", line);
  if (indent.undefined && !a.empty()) indent = a[0];
  return {Json(python_json_dumps(
              x.v, indent.undefined || indent.v.is_null() ? -1 : indent.v.get<int>())),
          false};
}

Value filter_trim(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                  const Expr&, int line) {
  return call_method(r, Value{Json(to_text(x)), false}, "strip", {}, line);
}

// upper, lower, title, capitalize, items: the method of that name, on text or a mapping.
Value filter_as_method(Renderer& r, const std::string& f, const Value& x, const std::vector<Value>&,
                       const Expr& e, int line) {
  return call_method(r, Value{x.v.is_object() ? x.v : Json(to_text(x)), false}, f, {}, line);
}

Value filter_string(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                    const Expr&, int) {
  return {Json(to_text(x)), false};
}

Value filter_safe(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                  const Expr&, int) {
  return x;
}

Value filter_default(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                     const Expr&, int) {
  const bool boolean = a.size() > 1 && truthy(a[1]);
  if (x.undefined || (boolean && !truthy(x))) return a.empty() ? Value{Json(""), false} : a[0];
  return x;
}

Value filter_first_or_last(Renderer& r, const std::string& f, const Value& x,
                           const std::vector<Value>&, const Expr&, int) {
  if (x.v.is_array() && !x.v.empty()) return {f == "first" ? x.v.front() : x.v.back(), false};
  return Value::undef();
}

Value filter_join(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                  const Expr&, int) {
  std::string out;
  const std::string sep = a.empty() ? "" : to_text(a[0]);
  if (x.v.is_array()) {
    for (size_t i = 0; i < x.v.size(); ++i) out += (i ? sep : "") + to_text({x.v[i], false});
  }
  return {Json(out), false};
}

Value filter_list(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                  const Expr&, int) {
  if (x.v.is_array()) return x;
  Json out = Json::array();
  if (x.v.is_string()) {
    for (uint32_t c : code_points(x.v.get<std::string>())) out.push_back(from_code_points({c}));
  }
  return {out, false};
}

Value filter_reverse(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                     const Expr&, int) {
  if (x.v.is_string()) {
    auto cps = code_points(x.v.get<std::string>());
    std::reverse(cps.begin(), cps.end());
    return {Json(from_code_points(cps)), false};
  }
  Json out = x.v;
  if (out.is_array()) std::reverse(out.begin(), out.end());
  return {out, false};
}

Value filter_int(Renderer& r, const std::string&, const Value& x, const std::vector<Value>&,
                 const Expr&, int line) {
  if (x.v.is_number_integer()) return {x.v, false};
  if (x.v.is_number()) {
    const double d = x.v.get<double>();
    // Python's int() of inf or nan raises; a float past 64 bits has no int here.
    if (!(std::fabs(d) < 9.2e18)) r.fail(line, "int of " + x.v.dump() + ": beyond 64 bits");
    return {Json(static_cast<int64_t>(d)), false};
  }
  try {
    return {Json(std::stoll(to_text(x))), false};
  } catch (const std::exception&) {
    return {Json(0), false};
  }
}

Value filter_replace(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                     const Expr& e, int line) {
  return call_method(r, Value{Json(to_text(x)), false}, "replace", a, line);
}

// The test named by a[1] (defined, undefined, equalto a[2]) on an attribute for filter f.
bool attribute_passes(const Renderer& r, const Value& attr, const std::vector<Value>& a,
                      const std::string& f, int line) {
  const std::string test = to_text(a[1]);
  if (test == "defined") return !attr.undefined;
  if (test == "undefined") return attr.undefined;
  if (test == "equalto" || test == "eq" || test == "==")
    return a.size() > 2 && !attr.undefined && attr.v == a[2].v;
  r.fail(line, "unsupported test " + test + " in " + f);
}

// selectattr / rejectattr: the attribute a[0] is truthy, or passes the test a[1] (with a[2]).
Value filter_select_or_reject(Renderer& r, const std::string& f, const Value& x,
                              const std::vector<Value>& a, const Expr&, int line) {
  Json out = Json::array();
  if (x.v.is_array() && !a.empty()) {
    for (const auto& item : x.v) {
      const Value attr = attribute({item, false}, to_text(a[0]));
      const bool keep = a.size() > 1 ? attribute_passes(r, attr, a, f, line) : truthy(attr);
      if (keep == (f == "selectattr")) out.push_back(item);
    }
  }
  return {out, false};
}

// map(attribute=NAME), or map(FILTER, ARGS...): that filter on each item (Gemma 4's
// `types | map('upper')`).
Value filter_map(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                 const Expr& e, int line) {
  Json out = Json::array();
  const Value attr = r.kwarg(e, "attribute", line);
  if (attr.undefined && a.empty()) r.fail(line, "map filter needs attribute= or a filter name");
  const std::string name = attr.undefined ? to_text(a[0]) : "";
  const Filter each = attr.undefined ? find_filter(name) : nullptr;
  if (attr.undefined && !each) r.fail(line, "unsupported filter " + name + " in map");
  const std::vector<Value> rest(a.begin() + (a.empty() ? 0 : 1), a.end());
  if (x.v.is_array()) {
    for (const auto& item : x.v) {
      out.push_back(each ? each(r, name, {item, false}, rest, e, line).v
                         : attribute({item, false}, to_text(attr)).v);
    }
  }
  return {out, false};
}

// dictsort(case_sensitive=false, by='key', reverse=false): a mapping's [key, value] pairs sorted
// as jinja2 sorts them (stable; strings compared lower-cased unless case_sensitive).
Value filter_dictsort(Renderer& r, const std::string&, const Value& x, const std::vector<Value>& a,
                      const Expr& e, int line) {
  if (!x.v.is_object()) r.fail(line, "dictsort of a value that is not a mapping");
  auto option = [&](const char* key, size_t at) {
    const Value v = r.kwarg(e, key, line);
    return !v.undefined ? v : (a.size() > at ? a[at] : Value::undef());
  };
  const Value case_sensitive = option("case_sensitive", 0), by = option("by", 1),
              reverse = option("reverse", 2);
  const size_t pos = !by.undefined && to_text(by) == "value" ? 1 : 0;
  if (!by.undefined && pos == 0 && to_text(by) != "key")
    r.fail(line, "dictsort by must be key or value");
  std::vector<Json> pairs;
  for (const auto& [k, v] : x.v.items()) pairs.push_back(Json::array({k, v}));
  auto sort_key = [&](const Json& pair) {
    const Json& v = pair[pos];
    if (!v.is_string() || truthy(case_sensitive)) return v;
    return call_method(r, Value{v, false}, "lower", {}, line).v;
  };
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Json& p, const Json& q) {
    return truthy(reverse) ? sort_key(q) < sort_key(p) : sort_key(p) < sort_key(q);
  });
  return {Json(pairs), false};
}

}  // namespace

Filter find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, Filter> filters = {
      {"length", &filter_length},
      {"count", &filter_length},
      {"tojson", &filter_tojson},
      {"trim", &filter_trim},
      {"upper", &filter_as_method},
      {"lower", &filter_as_method},
      {"title", &filter_as_method},
      {"capitalize", &filter_as_method},
      {"items", &filter_as_method},
      {"string", &filter_string},
      {"safe", &filter_safe},
      {"default", &filter_default},
      {"d", &filter_default},
      {"first", &filter_first_or_last},
      {"last", &filter_first_or_last},
      {"join", &filter_join},
      {"list", &filter_list},
      {"reverse", &filter_reverse},
      {"int", &filter_int},
      {"replace", &filter_replace},
      {"selectattr", &filter_select_or_reject},
      {"rejectattr", &filter_select_or_reject},
      {"map", &filter_map},
      {"dictsort", &filter_dictsort},
  };
  const auto hit = filters.find(name);
  return hit == filters.end() ? nullptr : hit->second;
}

}  // namespace moe::chat
