#include "moe/hf/hf_rope_keys.h"

#include <algorithm>
#include <cmath>

namespace moe::hf {

using families::HfKeys;
using nlohmann::json;

namespace {

// Python's truth value of a JSON value (transformers tests dicts with `or`).
bool truthy(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;  // null
}

// The rotary dict (`key`: rope_parameters or rope_scaling, an object) read as transformers reads
// it; every error names the dict's field.
class RopeDict {
 public:
  RopeDict(const HfKeys& keys, std::string dict_key)
      : k(keys), key(std::move(dict_key)), p(keys.raw(key)) {}

  [[noreturn]] void fail(const std::string& name, const std::string& what) const {
    k.fail_field(key, name, what);
  }
  bool has(const std::string& name) const { return p.contains(name); }
  std::string text(const char* name, const std::string& fallback) const {
    if (!p.contains(name) || p[name].is_null()) return fallback;
    if (!p[name].is_string()) fail(name, "expected a string");
    return p[name].get<std::string>();
  }
  // A number of the dict; null and absent are `fallback`, as transformers' .get().
  double number(const char* name, double fallback) const {
    if (!p.contains(name) || p[name].is_null()) return fallback;
    if (!p[name].is_number()) fail(name, "expected a number");
    return p[name].get<double>();
  }

  const HfKeys& k;
  const std::string key;
  const json& p;
};

// transformers warns about keys its rope type does not read, and ignores them; so do we.
void warn_unread_rope_keys(const RopeDict& d, const std::string& type,
                           std::vector<std::string>* warnings) {
  static const std::vector<std::string> kLinearKeys = {"rope_type", "type", "rope_theta", "factor",
                                                       "partial_rotary_factor"};
  static const std::vector<std::string> kYarnKeys = {"rope_type",
                                                     "type",
                                                     "rope_theta",
                                                     "factor",
                                                     "partial_rotary_factor",
                                                     "attention_factor",
                                                     "beta_fast",
                                                     "beta_slow",
                                                     "mscale",
                                                     "mscale_all_dim",
                                                     "llama_4_scaling_beta",
                                                     "max_position_embeddings",
                                                     "truncate",
                                                     "original_max_position_embeddings"};
  const auto& known = type == "yarn" ? kYarnKeys : kLinearKeys;
  for (const auto& [name, value] : d.p.items()) {
    if (std::find(known.begin(), known.end(), name) == known.end() && warnings != nullptr) {
      warnings->push_back(d.key + "." + name + " is not read by rope_type " + type + " (ignored)");
    }
  }
}

json linear_scaling(const RopeDict& d) {
  json s = {{"type", "linear"}};
  const double factor = d.number("factor", 0.0);
  if (factor < 1.0) {
    d.fail("factor",
           std::string(d.has("factor") ? "" : "missing: ") + "linear scaling needs a factor >= 1");
  }
  s["factor"] = factor;
  return s;
}

// yarn's pretraining window: a top-level original_max_position_embeddings first (transformers'
// rule, which takes a null there too), then the dict's (null stays null: transformers fails on
// it), then max_position_embeddings.
int64_t yarn_original_window(const RopeDict& d, bool has_max, int64_t max_positions) {
  const HfKeys& k = d.k;
  const std::string& key = d.key;
  const std::string kOriginal = "original_max_position_embeddings";
  if (k.has(kOriginal)) {
    if (!k.present(kOriginal) || k.integer(kOriginal) < 1) {
      k.fail(kOriginal, "expected a positive integer (yarn's pretraining window; it overrides " +
                            key + "." + kOriginal + ")");
    }
    return k.integer(kOriginal);
  }
  if (d.has(kOriginal)) {
    const double o = d.number(kOriginal.c_str(), 0.0);
    if (d.p[kOriginal].is_null() || o < 1 || o != std::floor(o)) {
      d.fail(kOriginal, "expected a positive integer (yarn's pretraining window)");
    }
    return static_cast<int64_t>(o);
  }
  if (has_max && max_positions >= 1) return max_positions;
  k.fail(has_max ? "max_position_embeddings" : key + "." + kOriginal,
         std::string(has_max ? "" : "missing: ") + "yarn needs the pretraining window (" + key +
             "." + kOriginal + ", or a positive max_position_embeddings)");
}

// transformers reads p["factor"]: a missing key is its KeyError; null is the ratio of the two
// windows (its rule for DeepSeek-V3-style configs).
double yarn_factor(const RopeDict& d, bool has_max, int64_t max_positions, int64_t original) {
  if (!d.has("factor")) {
    d.fail("factor",
           "missing (yarn needs a number >= 1, or null for "
           "max_position_embeddings / original_max_position_embeddings)");
  }
  if (d.p["factor"].is_null() && !has_max) {
    d.k.fail("max_position_embeddings",
             "missing: " + d.key +
                 ".factor = null takes the factor from max_position_embeddings / "
                 "original_max_position_embeddings");
  }
  const double factor = d.number("factor", double(max_positions) / double(original));
  if (factor < 1.0) d.fail("factor", "yarn scaling needs a factor >= 1");
  return factor;
}

// attention_factor, else DeepSeek's from mscale and mscale_all_dim, else 0 (our default).
double yarn_attention_factor(const RopeDict& d, double factor) {
  double attention = d.number("attention_factor", 0.0);
  if (d.has("attention_factor") && !d.p["attention_factor"].is_null() && attention <= 0) {
    d.fail("attention_factor", "expected a number > 0");
  }
  const double mscale = d.number("mscale", 0.0), mscale_all_dim = d.number("mscale_all_dim", 0.0);
  if (attention == 0 && mscale != 0 && mscale_all_dim != 0 && factor > 1) {
    // DeepSeek's form, in transformers' order of operations.
    attention =
        (0.1 * mscale * std::log(factor) + 1.0) / (0.1 * mscale_all_dim * std::log(factor) + 1.0);
  }
  return attention;
}

// transformers: `get("truncate", True)`, so an explicit null is falsy: no truncation.
bool yarn_truncate(const RopeDict& d) {
  if (!d.has("truncate")) return true;
  const json& t = d.p["truncate"];
  if (!t.is_null() && !t.is_boolean()) d.fail("truncate", "expected true, false or null");
  return t.is_boolean() && t.get<bool>();
}

json yarn_scaling(const RopeDict& d) {
  json s = {{"type", "yarn"}};
  const bool has_max = d.k.present("max_position_embeddings");
  const int64_t max_positions = d.k.integer("max_position_embeddings", 0);
  const int64_t original = yarn_original_window(d, has_max, max_positions);
  const double factor = yarn_factor(d, has_max, max_positions, original);
  double attention = yarn_attention_factor(d, factor);
  // transformers: `get("beta_fast") or 32`, so 0 and null are the defaults too.
  const double beta_fast = d.number("beta_fast", 0.0), beta_slow = d.number("beta_slow", 0.0);
  if ((beta_fast != 0 ? beta_fast : 32.0) < (beta_slow != 0 ? beta_slow : 1.0)) {
    d.fail("beta_fast",
           "must be >= beta_slow (the ramp runs from beta_fast rotations "
           "down to beta_slow)");
  }
  const bool truncate = yarn_truncate(d);
  s["factor"] = factor;
  s["original_max_position_embeddings"] = original;
  s["beta_fast"] = beta_fast != 0 ? beta_fast : 32.0;
  s["beta_slow"] = beta_slow != 0 ? beta_slow : 1.0;
  s["attention_factor"] = attention;
  s["truncate"] = truncate;
  // Latent attention's softmax scale (DeepSeek-V2/V3; transformers' yarn_apply_mscale).
  if (const double all_dim = d.number("mscale_all_dim", 0.0); all_dim != 0) {
    if (all_dim < 0) d.fail("mscale_all_dim", "expected a number >= 0");
    s["mscale_all_dim"] = all_dim;
  }
  // Mistral Small 4's query scaling past the pretraining window.
  if (const double beta = d.number("llama_4_scaling_beta", 0.0); beta != 0) {
    if (beta < 0) d.fail("llama_4_scaling_beta", "expected a number >= 0");
    s["llama_4_scaling_beta"] = beta;
  }
  return s;
}

}  // namespace

RopeSettings rope_settings(const HfKeys& k, double family_default, double partial_default,
                           std::vector<std::string>* warnings) {
  RopeSettings r{k.number("rope_theta", family_default), nullptr};
  const bool partial_ok = partial_default > 0;
  auto partial = [&](double f, auto&& fail) {
    if (!partial_ok && f != 1.0) fail("only 1 is supported (every dimension of the head rotates)");
    if (partial_ok && !(f > 0 && f <= 1)) fail("expected a factor in (0, 1]");
    r.partial_rotary_factor = f;
  };
  if (partial_ok) r.partial_rotary_factor = partial_default;
  // transformers 5 takes a truthy rope_scaling over rope_parameters (`rope_scaling or
  // rope_parameters`): null, false, 0, "" and {} leave rope_parameters in charge.
  const bool legacy = k.present("rope_scaling") && truthy(k.raw("rope_scaling"));
  const std::string key = legacy ? "rope_scaling" : "rope_parameters";
  // A top-level partial_rotary_factor goes into the dict where the dict has none (its
  // setdefault); null at the top level is no value.
  const bool dict_partial =
      k.present(key) && k.raw(key).is_object() && k.raw(key).contains("partial_rotary_factor");
  if (!dict_partial && k.present("partial_rotary_factor")) {
    partial(k.number("partial_rotary_factor", 1.0),
            [&](const std::string& why) { k.fail("partial_rotary_factor", why); });
  }
  if (!k.present(key)) return r;
  if (!k.raw(key).is_object()) k.fail(key, "expected an object");
  const RopeDict d(k, key);
  const std::string type = d.text("rope_type", d.text("type", "default"));
  r.theta = d.number("rope_theta", r.theta);
  if (dict_partial && d.p["partial_rotary_factor"].is_null()) {
    d.fail("partial_rotary_factor", "expected a number (transformers fails on null)");
  }
  if (dict_partial) {
    partial(d.number("partial_rotary_factor", 1.0),
            [&](const std::string& why) { d.fail("partial_rotary_factor", why); });
  }
  if (type == "default") return r;
  if (type != "linear" && type != "yarn") {
    d.fail(d.has("rope_type") ? "rope_type" : "type",
           "not supported (default, linear and yarn are)");
  }
  warn_unread_rope_keys(d, type, warnings);
  r.scaling = type == "yarn" ? yarn_scaling(d) : linear_scaling(d);
  return r;
}

}  // namespace moe::hf
