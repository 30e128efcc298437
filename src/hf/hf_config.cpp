#include "moe/hf/hf_config.h"

#include <algorithm>
#include <cmath>

#include "moe/util/errors.h"

namespace moe::hf {

using nlohmann::json;

namespace {

struct FamilyNames {
  Family family;
  const char* architecture;
  const char* model_type;
};
constexpr FamilyNames kFamilies[] = {
    {Family::kMixtral, "MixtralForCausalLM", "mixtral"},
    {Family::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Family::kOlmoe, "OlmoeForCausalLM", "olmoe"},
    {Family::kGptOss, "GptOssForCausalLM", "gpt_oss"},
    {Family::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe"},
    {Family::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
    {Family::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
};

// Typed reads of config.json keys; every error names the file and the key.
class HfKeys {
 public:
  HfKeys(const json& c, std::string file) : c_(c), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const std::string value = c_.contains(key) ? " = " + c_[key].dump() : "";
    throw UserError("hf: " + file_ + ": " + key + value + ": " + what);
  }
  // A field of a nested dict (rope_parameters.factor): names the field, not the whole dict.
  [[noreturn]] void fail_field(const std::string& key, const std::string& name,
                               const std::string& what) const {
    const json& d = c_.at(key);
    const std::string value = d.is_object() && d.contains(name) ? " = " + d.at(name).dump() : "";
    throw UserError("hf: " + file_ + ": " + key + "." + name + value + ": " + what);
  }
  bool has(const std::string& key) const { return c_.contains(key); }  // null included
  bool present(const std::string& key) const { return c_.contains(key) && !c_[key].is_null(); }
  int64_t integer(const std::string& key) const {
    if (!present(key)) fail(key, "missing (an integer is required)");
    if (!c_[key].is_number_integer() || c_[key].get<int64_t>() < 0) {
      fail(key, "expected a non-negative integer");
    }
    return c_[key].get<int64_t>();
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    return present(key) ? integer(key) : fallback;
  }
  double number(const std::string& key, double fallback) const {
    if (!present(key)) return fallback;
    if (!c_[key].is_number()) fail(key, "expected a number");
    return c_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!c_[key].is_boolean()) fail(key, "expected true or false");
    return c_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    if (!c_[key].is_string()) fail(key, "expected a string");
    return c_[key].get<std::string>();
  }
  std::vector<int64_t> integers(const std::string& key) const {
    if (!present(key)) return {};
    if (!c_[key].is_array()) fail(key, "expected an array of layer indices");
    std::vector<int64_t> out;
    for (const auto& v : c_[key]) {
      if (!v.is_number_integer()) fail(key, "expected an array of layer indices");
      out.push_back(v.get<int64_t>());
    }
    return out;
  }
  std::vector<std::string> strings(const std::string& key, const std::string& what) const {
    if (!present(key)) return {};
    if (!c_[key].is_array()) fail(key, "expected an array of " + what);
    std::vector<std::string> out;
    for (const auto& v : c_[key]) {
      if (!v.is_string()) fail(key, "expected an array of " + what);
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  const json& raw(const std::string& key) const { return c_[key]; }

 private:
  const json& c_;
  std::string file_;
};

// The rotary settings: rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x), read
// as transformers reads them. Rope types default, linear and yarn are what our attention
// computes; `scaling` is our model.rope_scaling (null: default).
// Python's truth value of a JSON value (transformers tests dicts with `or`).
bool truthy(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  if (v.is_array() || v.is_object()) return !v.empty();
  return false;  // null
}

struct RopeSettings {
  double theta;
  json scaling;
  double partial_rotary_factor = 1.0;
};

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
  return s;
}

// partial_default: the family's partial_rotary_factor when config.json has none (GLM-4.5's
// config sets 0.5); 0 = the family rotates every dimension and refuses another factor.
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

}  // namespace

const char* architecture_name(Family f) {
  for (const auto& n : kFamilies) {
    if (n.family == f) return n.architecture;
  }
  return "?";
}

const char* model_type(Family f) {
  for (const auto& n : kFamilies) {
    if (n.family == f) return n.model_type;
  }
  return "?";
}

Family parse_family(const std::string& architecture, const std::string& where) {
  for (const auto& n : kFamilies) {
    if (architecture == n.architecture || architecture == n.model_type) return n.family;
  }
  throw UserError(where + " \"" + architecture +
                  "\" is not supported: expected MixtralForCausalLM, Qwen3MoeForCausalLM, "
                  "OlmoeForCausalLM, GptOssForCausalLM, Glm4MoeForCausalLM, "
                  "DeepseekV2ForCausalLM or DeepseekV3ForCausalLM");
}

// The training window: the model's max_position_embeddings up to kImportSeqLenCap (a 32k window
// by default would surprise a fine-tune with its memory; rotary models train and evaluate at any
// model.seq_len the run config sets). Never silent: the import says so.
static int64_t training_window(int64_t max_positions, std::vector<std::string>* warnings) {
  if (max_positions > kImportSeqLenCap && warnings != nullptr) {
    warnings->push_back(
        "model.seq_len = " + std::to_string(kImportSeqLenCap) + " (max_position_embeddings is " +
        std::to_string(max_positions) +
        "; set model.seq_len in the training config for longer windows, and see "
        "what they cost with moe-train plan); exports keep max_position_embeddings");
  }
  return std::min<int64_t>(max_positions, kImportSeqLenCap);
}

// gpt-oss (transformers' GptOssConfig): biases, sinks, alternating sliding windows, a biased
// router whose top-k logits are softmaxed (= softmax scores renormalised over the k), clamped
// SwiGLU experts.
static void gpt_oss_architecture(const HfKeys& k, json& m, json& e) {
  const int64_t layers = k.integer("num_hidden_layers");
  m["attention_bias"] = k.boolean("attention_bias", true);
  m["attention_sinks"] = true;
  m["qk_norm"] = false;
  const int64_t window = k.integer("sliding_window", 0);
  m["sliding_window"] = window;
  std::vector<std::string> types = k.strings("layer_types", "full_attention / sliding_attention");
  if (types.empty()) {  // GptOssConfig's default: even layers slide
    for (int64_t i = 0; i < layers; ++i) {
      types.push_back((i + 1) % 2 ? "sliding_attention" : "full_attention");
    }
  }
  if (static_cast<int64_t>(types.size()) != layers) {
    k.fail("layer_types",
           "needs one entry per layer (num_hidden_layers = " + std::to_string(layers) + ")");
  }
  for (const auto& t : types) {
    if (t != "full_attention" && t != "sliding_attention") {
      k.fail("layer_types", "expected full_attention or sliding_attention, got " + t);
    }
    if (t == "sliding_attention" && window <= 0) {
      k.fail("sliding_window", "sliding_attention layers need a window > 0");
    }
  }
  m["layer_types"] = types;
  e["num_experts"] = k.integer("num_local_experts");
  e["expert_hidden_size"] = k.integer("intermediate_size");
  e["normalize_topk"] = true;
  e["softmax_after_topk"] = true;
  e["router_bias"] = true;
  e["expert_bias"] = true;
  e["activation"] = "clamped_swiglu";
  e["swiglu_limit"] = k.number("swiglu_limit", 7.0);
  e["swiglu_alpha"] = k.number("swiglu_alpha", 1.702);
}

// The leading dense layers, first_k_dense_replace (default: the config class's).
static json first_dense(const HfKeys& k, int64_t fallback) {
  const int64_t layers = k.integer("num_hidden_layers");
  const int64_t dense = k.integer("first_k_dense_replace", fallback);
  if (dense > layers) k.fail("first_k_dense_replace", "exceeds num_hidden_layers");
  std::vector<int64_t> dense_layers;
  for (int64_t i = 0; i < dense; ++i) dense_layers.push_back(i);
  return dense_layers;
}

// GLM-4.5 / 4.6 / 4.5-Air (transformers' Glm4MoeConfig): DeepSeek-V3's routing (sigmoid scores,
// e_score_correction_bias, groups, scaled weights, shared experts, dense first layers) over
// GQA attention with q/k/v biases, optional per-head q/k norms and partial rotary.
static void glm4_moe_architecture(const HfKeys& k, json& m, json& e,
                                  std::vector<std::string>* warnings) {
  e["num_experts"] = k.present("n_routed_experts") ? k.integer("n_routed_experts")
                                                   : k.integer("num_local_experts");
  const int64_t f = k.integer("moe_intermediate_size");
  e["expert_hidden_size"] = f;
  m["dense_hidden_size"] = k.integer("intermediate_size");
  e["mlp_only_layers"] = first_dense(k, 1);
  e["shared_expert_hidden_size"] = k.integer("n_shared_experts", 1) * f;
  e["score_function"] = "sigmoid";
  e["normalize_topk"] = k.boolean("norm_topk_prob", true);
  e["n_group"] = k.integer("n_group", 1);
  e["topk_group"] = k.integer("topk_group", 1);
  e["routed_scaling_factor"] = k.number("routed_scaling_factor", 1.0);
  e["aux_loss_coeff"] = 0.0;  // balanced by the correction bias (moe.router_bias_update_rate)
  m["qk_norm"] = k.boolean("use_qk_norm", false);
  m["qk_norm_scope"] = "head";
  m["qkv_bias"] = k.boolean("attention_bias", false);
  (void)warnings;  // the MTP layers' tensors are counted where they are skipped (load_hf_weights)
}

// DeepSeek-V2 / V3, Kimi, Moonlight (transformers' DeepseekV2Config / DeepseekV3Config; their
// defaults where config.json has no key): multi-head latent attention, shared experts, dense
// first layers. V3: sigmoid scores with e_score_correction_bias, groups scored by their two
// best, normalised and scaled weights. V2: softmax scores, topk_method greedy or
// group_limited_greedy (groups scored by their best), scaled and never normalised.
static void deepseek_architecture(const HfKeys& k, bool v3, json& m, json& e,
                                  std::vector<std::string>* warnings) {
  const int64_t heads = k.integer("num_attention_heads");
  if (k.integer("num_key_value_heads", heads) != heads) {
    k.fail("num_key_value_heads",
           "must equal num_attention_heads: latent attention gives every head its own keys");
  }
  m["num_key_value_heads"] = 0;
  m["head_dim"] = 0;  // transformers' head_dim here is qk_rope_head_dim, the rotary width
  m["kv_lora_rank"] = k.integer("kv_lora_rank", 512);
  if (m["kv_lora_rank"].get<int64_t>() == 0) k.fail("kv_lora_rank", "expected a positive integer");
  m["q_lora_rank"] = k.has("q_lora_rank") ? k.integer("q_lora_rank", 0) : int64_t{1536};
  m["qk_nope_head_dim"] = k.integer("qk_nope_head_dim", 128);
  m["qk_rope_head_dim"] = k.integer("qk_rope_head_dim", 64);
  m["v_head_dim"] = k.integer("v_head_dim", 128);
  m["rope_interleave"] = v3 ? k.boolean("rope_interleave", true) : true;  // V2: complex form
  m["qk_norm"] = false;
  m["dense_hidden_size"] = k.integer("intermediate_size");
  e["num_experts"] = k.integer("n_routed_experts", v3 ? 256 : 64);
  const int64_t f = k.integer("moe_intermediate_size");
  e["expert_hidden_size"] = f;
  e["mlp_only_layers"] = first_dense(k, v3 ? 3 : 0);
  e["shared_expert_hidden_size"] = k.integer("n_shared_experts", v3 ? 1 : 2) * f;
  e["routed_scaling_factor"] = k.number("routed_scaling_factor", v3 ? 2.5 : 1.0);
  e["aux_loss_coeff"] = 0.0;  // transformers' DeepSeek classes train without one
  if (v3) {
    e["score_function"] = "sigmoid";
    e["normalize_topk"] = k.boolean("norm_topk_prob", true);
    e["n_group"] = k.integer("n_group", 8);
    e["topk_group"] = k.integer("topk_group", 4);
    e["group_score_experts"] = 2;
    return;
  }
  e["score_function"] = "softmax";
  e["normalize_topk"] = false;
  if (k.boolean("norm_topk_prob", false) && warnings != nullptr) {
    warnings->push_back(
        "norm_topk_prob = true is not applied: transformers' DeepseekV2 router never "
        "renormalises (neither does moe-train for this family)");
  }
  const std::string method = k.string("topk_method", "greedy");
  if (method == "greedy") return;
  if (method != "group_limited_greedy") {
    k.fail("topk_method", "expected greedy or group_limited_greedy (transformers' DeepseekV2)");
  }
  e["n_group"] = k.integer("n_group");
  e["topk_group"] = k.integer("topk_group");
  e["group_score_experts"] = 1;
}

// The keys each family names its own way (experts, widths, norms, routing).
static void family_architecture(const HfKeys& k, Family family, json& m, json& e,
                                std::vector<std::string>* warnings) {
  const int64_t hidden = m["hidden_size"].get<int64_t>(), heads = m["num_heads"].get<int64_t>();
  switch (family) {
    case Family::kMixtral:
      e["num_experts"] = k.integer("num_local_experts");
      e["expert_hidden_size"] = k.integer("intermediate_size");
      e["normalize_topk"] = true;
      m["qk_norm"] = false;
      if (k.number("router_jitter_noise", 0.0) != 0.0 && warnings != nullptr) {
        warnings->push_back("router_jitter_noise is not imported (moe-train routes without it)");
      }
      break;
    case Family::kQwen3Moe:
      e["num_experts"] =
          k.present("num_experts") ? k.integer("num_experts") : k.integer("num_local_experts");
      e["expert_hidden_size"] = k.integer("moe_intermediate_size");
      m["dense_hidden_size"] = k.integer("intermediate_size");
      e["decoder_sparse_step"] = k.integer("decoder_sparse_step", 1);
      e["mlp_only_layers"] = k.integers("mlp_only_layers");
      e["normalize_topk"] = k.boolean("norm_topk_prob", false);
      m["qk_norm"] = true;
      m["qk_norm_scope"] = "head";
      break;
    case Family::kGptOss:
      gpt_oss_architecture(k, m, e);
      break;
    case Family::kGlm4Moe:
      glm4_moe_architecture(k, m, e, warnings);
      break;
    case Family::kDeepseekV2:
    case Family::kDeepseekV3:
      deepseek_architecture(k, family == Family::kDeepseekV3, m, e, warnings);
      break;
    case Family::kOlmoe:
      e["num_experts"] = k.integer("num_experts");
      e["expert_hidden_size"] = k.integer("intermediate_size");
      e["normalize_topk"] = k.boolean("norm_topk_prob", false);
      m["qk_norm"] = true;
      m["qk_norm_scope"] = "full";
      m["clip_qkv"] = k.number("clip_qkv", 0.0);
      if (m["head_dim"].get<int64_t>() * heads != hidden) {
        k.fail("head_dim", "OLMoE's q/k norms need num_attention_heads x head_dim = hidden_size");
      }
      break;
  }
}

json architecture_from_hf(const json& c, const std::string& file, Family* family_out,
                          std::vector<std::string>* warnings) {
  if (!c.is_object()) throw UserError("hf: " + file + ": expected a JSON object");
  HfKeys k(c, file);
  std::string arch;
  if (k.present("architectures")) {
    const json& a = c["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      k.fail("architectures", "expected a list of architecture names");
    }
    arch = a[0].get<std::string>();
  } else {
    arch = k.string("model_type", "");
    if (arch.empty()) k.fail("architectures", "missing (and no model_type)");
  }
  const Family family = parse_family(arch, "hf: " + file + ": architectures:");
  if (family_out != nullptr) *family_out = family;

  if (k.string("hidden_act", "silu") != "silu") k.fail("hidden_act", "only silu is supported");
  const bool gpt_oss = family == Family::kGptOss;
  const bool glm = family == Family::kGlm4Moe;
  if (k.boolean("attention_bias", false) && !gpt_oss && !glm) {
    k.fail("attention_bias", "biases are supported for gpt_oss and glm4_moe only");
  }
  if (k.present("sliding_window") && family == Family::kMixtral) {
    k.fail("sliding_window", "sliding-window attention is not supported (null is)");
  }
  if (k.boolean("use_sliding_window", false)) {
    k.fail("use_sliding_window", "sliding-window attention is not supported");
  }
  const int64_t hidden = k.integer("hidden_size"), heads = k.integer("num_attention_heads");
  if (heads == 0 || hidden % heads != 0) {
    if (!k.present("head_dim")) k.fail("num_attention_heads", "must divide hidden_size");
  }
  json m;
  m["vocab_size"] = k.integer("vocab_size");
  m["hidden_size"] = hidden;
  m["num_layers"] = k.integer("num_hidden_layers");
  m["num_heads"] = heads;
  m["num_key_value_heads"] = k.integer("num_key_value_heads", heads);
  m["head_dim"] = k.integer("head_dim", hidden / std::max<int64_t>(heads, 1));
  m["norm_eps"] = k.number("rms_norm_eps", 1e-6);
  m["tie_embeddings"] = k.boolean("tie_word_embeddings", false);
  const double default_theta = family == Family::kMixtral ? 1e6 : gpt_oss ? 150000.0 : 1e4;
  // GLM-4.5's config class sets partial_rotary_factor 0.5 where config.json has none.
  const RopeSettings rope = rope_settings(k, default_theta, glm ? 0.5 : 0.0, warnings);
  m["rope_theta"] = rope.theta;
  m["partial_rotary_factor"] = rope.partial_rotary_factor;
  if (!rope.scaling.is_null()) m["rope_scaling"] = rope.scaling;
  m["init_std"] = k.number("initializer_range", 0.02);
  m["seq_len"] = training_window(k.integer("max_position_embeddings", kImportSeqLenCap), warnings);
  m["dropout"] = 0.0;
  if (k.number("attention_dropout", 0.0) != 0.0 && warnings != nullptr) {
    warnings->push_back("attention_dropout is not imported (model.dropout = 0)");
  }
  json e;
  e["top_k"] = k.integer("num_experts_per_tok");
  e["score_function"] = "softmax";
  e["capacity_factor"] = 0.0;
  e["aux_loss_coeff"] = k.number("router_aux_loss_coef", 0.01);
  e["z_loss_coeff"] = 0.0;
  family_architecture(k, family, m, e, warnings);
  if (e["top_k"].get<int64_t>() == 1 && e["normalize_topk"].get<bool>()) {
    k.fail("num_experts_per_tok",
           "top-1 routing with renormalised weights (a weight of exactly 1) is not supported");
  }
  return {{"model", m}, {"moe", e}};
}

// The leading dense layers (GLM-4.5's first_k_dense_replace).
static int64_t first_dense_layers(const config::Config& cfg) {
  int64_t n = 0;
  while (n < cfg.model.num_layers && !config::is_moe_layer(cfg, n)) ++n;
  return n;
}

// What only gpt-oss has, refused for the other families.
static void check_gpt_oss_features(const config::Config& cfg, Family f) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError(key + ": " + why);
  };
  if (f == Family::kGptOss) return;
  const char* only = "only gpt_oss has this among the families export-hf writes";
  if (m.attention_bias) refuse("model.attention_bias", only);
  if (m.attention_sinks) refuse("model.attention_sinks", only);
  if (m.sliding_window > 0) refuse("model.sliding_window", only);
  if (e.router_bias) refuse("moe.router_bias", only);
  if (e.softmax_after_topk) refuse("moe.softmax_after_topk", only);
  if (e.expert_bias) refuse("moe.expert_bias", only);
  if (e.activation != config::ExpertActivation::kSwiglu) refuse("moe.activation", only);
}

// What a gpt-oss export needs to be one.
static void check_gpt_oss_export(const config::Config& cfg) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  const bool all_moe = config::moe_layer_count(cfg) == m.num_layers;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError(key + ": " + why);
  };
  if (!m.attention_bias) refuse("model.attention_bias", "gpt-oss has q/k/v/o biases");
  if (!m.attention_sinks) refuse("model.attention_sinks", "gpt-oss has attention sinks");
  if (m.qk_norm) refuse("model.qk_norm", "gpt-oss has no q/k norms");
  if (m.clip_qkv > 0) refuse("model.clip_qkv", "gpt-oss does not clip q, k, v");
  if (!all_moe) refuse("moe.mlp_only_layers", "gpt-oss has no dense layers");
  if (!e.softmax_after_topk) {
    refuse("moe.softmax_after_topk", "gpt-oss softmaxes the top-k logits");
  }
  if (!e.router_bias) refuse("moe.router_bias", "gpt-oss's router has a bias");
  if (!e.expert_bias) refuse("moe.expert_bias", "gpt-oss's experts have biases");
  if (e.activation != config::ExpertActivation::kClampedSwiglu) {
    refuse("moe.activation", "gpt-oss's experts use clamped_swiglu");
  }
}

// What a GLM-4.5 export needs to be one: the layer rule first_k_dense_replace can say, shared
// experts as whole multiples of the routed width, sigmoid scores.
static void check_glm4_moe_export(const config::Config& cfg) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError(key + ": " + why);
  };
  if (e.score_function != config::ScoreFunction::kSigmoid) {
    refuse("moe.score_function", "GLM-4.5 routes with sigmoid scores");
  }
  if (m.qk_norm && m.qk_norm_scope != config::QkNormScope::kHead) {
    refuse("model.qk_norm_scope", "GLM-4.5's q/k norms are per head");
  }
  if (m.clip_qkv > 0) refuse("model.clip_qkv", "GLM-4.5 does not clip q, k, v");
  const int64_t f = config::expert_hidden_size(cfg);
  if (e.shared_expert_hidden_size == 0 || e.shared_expert_hidden_size % f != 0) {
    refuse("moe.shared_expert_hidden_size",
           "a sigmoid-routed model is exported as GLM-4.5, whose shared experts are "
           "n_shared_experts >= 1 x moe_intermediate_size (" +
               std::to_string(f) + ")");
  }
  const int64_t dense = first_dense_layers(cfg);
  for (int64_t i = 0; i < m.num_layers; ++i) {
    if (config::is_moe_layer(cfg, i) != (i >= dense)) {
      refuse("moe.mlp_only_layers",
             "GLM-4.5's dense layers are the first first_k_dense_replace ones");
    }
  }
}

// What a DeepSeek-V2 / V3 export needs to be one: latent attention, the family's router,
// shared experts as whole multiples of the routed width, dense layers first.
static void check_deepseek_export(const config::Config& cfg, Family f) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw UserError(key + ": " + why);
  };
  const bool v3 = f == Family::kDeepseekV3;
  const std::string name = v3 ? "DeepSeek-V3" : "DeepSeek-V2";
  if (!config::latent_attention(cfg)) {
    refuse("model.kv_lora_rank", name + " has multi-head latent attention (kv_lora_rank > 0)");
  }
  if (v3 && e.score_function != config::ScoreFunction::kSigmoid) {
    refuse("moe.score_function", "DeepSeek-V3 routes with sigmoid scores");
  }
  if (!v3 && e.score_function != config::ScoreFunction::kSoftmax) {
    refuse("moe.score_function", "DeepSeek-V2 routes with softmax scores");
  }
  if (!v3 && e.normalize_topk && e.top_k > 1) {
    refuse("moe.normalize_topk", "DeepSeek-V2's router never renormalises the top-k weights");
  }
  if (!v3 && e.router_bias_update_rate > 0) {
    refuse("moe.router_bias_update_rate", "DeepSeek-V2 has no selection bias");
  }
  if (!v3 && !m.rope_interleave) {
    refuse("model.rope_interleave", "DeepSeek-V2 rotates interleaved pairs (always true)");
  }
  if (e.n_group > 1 && e.group_score_experts != (v3 ? 2 : 1)) {
    refuse("moe.group_score_experts", name + " scores a group by its " +
                                          std::string(v3 ? "two best experts (2)" : "best (1)"));
  }
  const int64_t f_width = config::expert_hidden_size(cfg);
  if (e.shared_expert_hidden_size % f_width != 0) {
    refuse("moe.shared_expert_hidden_size",
           name + "'s shared experts are n_shared_experts x moe_intermediate_size (" +
               std::to_string(f_width) + ")");
  }
  const int64_t dense = first_dense_layers(cfg);
  for (int64_t i = 0; i < m.num_layers; ++i) {
    if (config::is_moe_layer(cfg, i) != (i >= dense)) {
      refuse("moe.mlp_only_layers",
             name + "'s dense layers are the first first_k_dense_replace ones");
    }
  }
}

Family export_family(const config::Config& cfg, const std::string& requested) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw UserError(key + ": " + why);
  };
  if (m.rope_theta <= 0) {
    refuse("model.rope_theta", "0 (learned positions); the Hugging Face MoE families use rotary");
  }
  if (e.top_k == 1 && e.normalize_topk) {
    refuse("moe.top_k", "1 with moe.normalize_topk: HF renormalises a single weight to 1");
  }
  Family f = Family::kMixtral;
  if (!requested.empty()) {
    f = parse_family(requested, "export-hf: --architecture");
  } else if (config::latent_attention(cfg)) {
    f = e.score_function == config::ScoreFunction::kSigmoid ? Family::kDeepseekV3
                                                            : Family::kDeepseekV2;
  } else if (e.score_function == config::ScoreFunction::kSigmoid ||
             e.shared_expert_hidden_size > 0 || m.qkv_bias || m.partial_rotary_factor != 1.0) {
    f = Family::kGlm4Moe;
  } else if (m.attention_sinks) {
    f = Family::kGptOss;
  } else if (m.qk_norm) {
    f = m.qk_norm_scope == config::QkNormScope::kFull ? Family::kOlmoe : Family::kQwen3Moe;
  }
  const bool all_moe = config::moe_layer_count(cfg) == m.num_layers;
  check_gpt_oss_features(cfg, f);
  if (deepseek(f)) {
    check_deepseek_export(cfg, f);
    return f;
  }
  const char* mla = "latent attention: only deepseek_v2 and deepseek_v3 have it";
  if (config::latent_attention(cfg)) refuse("model.kv_lora_rank", mla);
  if (m.rope_interleave) refuse("model.rope_interleave", mla);
  if (e.n_group > 1 && e.group_score_experts != 2) {
    refuse("moe.group_score_experts", "2 is the only group score of the other families");
  }
  if (f == Family::kGlm4Moe) {
    check_glm4_moe_export(cfg);
    return f;
  }
  // DeepSeek-V3's routing and GLM-4.5's attention, refused for the others.
  const char* glm = "only glm4_moe has this among the families export-hf writes";
  if (e.shared_expert_hidden_size > 0) refuse("moe.shared_expert_hidden_size", glm);
  if (e.score_function != config::ScoreFunction::kSoftmax) refuse("moe.score_function", glm);
  if (e.router_bias_update_rate > 0) refuse("moe.router_bias_update_rate", glm);
  if (e.n_group > 1) refuse("moe.n_group", glm);
  if (e.routed_scaling_factor != 1.0) refuse("moe.routed_scaling_factor", glm);
  if (m.qkv_bias) refuse("model.qkv_bias", glm);
  if (m.partial_rotary_factor != 1.0) refuse("model.partial_rotary_factor", glm);
  switch (f) {
    case Family::kGptOss:
      check_gpt_oss_export(cfg);
      break;
    case Family::kMixtral:
      if (m.qk_norm) refuse("model.qk_norm", "Mixtral has no q/k norms");
      if (!e.normalize_topk) refuse("moe.normalize_topk", "Mixtral always renormalises");
      if (!all_moe) refuse("moe.mlp_only_layers", "Mixtral has no dense layers");
      if (m.clip_qkv > 0) refuse("model.clip_qkv", "Mixtral does not clip q, k, v");
      break;
    case Family::kQwen3Moe:
      if (!m.qk_norm || m.qk_norm_scope != config::QkNormScope::kHead) {
        refuse("model.qk_norm", "Qwen3-MoE has per-head q/k norms (qk_norm_scope head)");
      }
      if (m.clip_qkv > 0) refuse("model.clip_qkv", "Qwen3-MoE does not clip q, k, v");
      break;
    case Family::kOlmoe:
      if (!m.qk_norm || m.qk_norm_scope != config::QkNormScope::kFull) {
        refuse("model.qk_norm", "OLMoE has full-width q/k norms (qk_norm_scope full)");
      }
      if (!all_moe) refuse("moe.mlp_only_layers", "OLMoE has no dense layers");
      if (config::head_dim(cfg) * m.num_heads != m.hidden_size) {
        refuse("model.head_dim", "OLMoE needs num_heads x head_dim = hidden_size");
      }
      break;
    case Family::kGlm4Moe:
    case Family::kDeepseekV2:
    case Family::kDeepseekV3:
      break;
  }
  return f;
}

json rope_parameters(const config::ModelConfig& m) {
  const auto& s = m.rope_scaling;
  json p = {{"rope_type",
             s.type == config::RopeScalingType::kNone ? "default" : std::string(name(s.type))},
            {"rope_theta", m.rope_theta}};
  if (s.type == config::RopeScalingType::kNone) return p;
  p["factor"] = s.factor;
  if (s.type != config::RopeScalingType::kYarn) return p;
  p["original_max_position_embeddings"] = s.original_max_position_embeddings;
  p["beta_fast"] = s.beta_fast;
  p["beta_slow"] = s.beta_slow;
  if (s.attention_factor > 0) p["attention_factor"] = s.attention_factor;
  if (s.mscale_all_dim > 0) p["mscale_all_dim"] = s.mscale_all_dim;
  p["truncate"] = s.truncate;
  return p;
}

int64_t yarn_window(const config::RopeScalingConfig& s) {
  return static_cast<int64_t>(std::llround(s.factor * double(s.original_max_position_embeddings)));
}

config::RopeScalingConfig rope_scaling_of(const json& hf_config, const std::string& file) {
  const json model = architecture_from_hf(hf_config, file, nullptr, nullptr)["model"];
  // Read through the config reader (its defaults for the keys an HF dict leaves out).
  const json root = {
      {"model",
       {{"rope_theta", 1.0}, {"rope_scaling", model.value("rope_scaling", json::object())}}},
      {"data", {{"path", "-"}}},
      {"train_micro_batch_size_per_gpu", 1}};
  return config::from_json(root, file).model.rope_scaling;
}

// Each layer's type as transformers names it (model.layer_types, or what an empty list means).
static json gpt_oss_layer_types(const config::Config& cfg) {
  json types = json::array();
  for (int64_t i = 0; i < cfg.model.num_layers; ++i) {
    types.push_back(config::attention_window(cfg, i) > 0 ? "sliding_attention" : "full_attention");
  }
  return types;
}

// DeepSeek-V2 / V3's keys (DeepseekV2Config / DeepseekV3Config).
static void deepseek_keys_to_hf(const config::Config& cfg, Family f, json& j) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  const int64_t width = config::expert_hidden_size(cfg);
  j["n_routed_experts"] = e.num_experts;
  j["moe_intermediate_size"] = width;
  j["intermediate_size"] = config::dense_hidden_size(cfg);
  j["first_k_dense_replace"] = first_dense_layers(cfg);
  j["n_shared_experts"] = e.shared_expert_hidden_size / width;
  j["routed_scaling_factor"] = e.routed_scaling_factor;
  j["n_group"] = e.n_group;
  j["topk_group"] = e.topk_group;
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["q_lora_rank"] = m.q_lora_rank > 0 ? json(m.q_lora_rank) : json(nullptr);
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["attention_bias"] = false;
  j.erase("head_dim");  // the class derives both (qk_rope_head_dim; nope + rope)
  j.erase("qk_head_dim");
  j.erase("router_aux_loss_coef");
  if (f == Family::kDeepseekV3) {
    j["norm_topk_prob"] = e.normalize_topk;
    j["rope_interleave"] = m.rope_interleave;
    j["num_nextn_predict_layers"] = 0;  // the MTP layers are not imported (docs/hf.md)
  } else {
    j["norm_topk_prob"] = false;
    j["topk_method"] = e.n_group > 1 ? "group_limited_greedy" : "greedy";
  }
}

// The keys each family writes its own way.
static void family_keys_to_hf(const config::Config& cfg, Family f, json& j) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  switch (f) {
    case Family::kMixtral:
      j["num_local_experts"] = e.num_experts;
      j["intermediate_size"] = config::expert_hidden_size(cfg);
      j["sliding_window"] = nullptr;
      j["router_jitter_noise"] = 0.0;
      break;
    case Family::kQwen3Moe:
      j["num_experts"] = e.num_experts;
      j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
      j["intermediate_size"] = config::dense_hidden_size(cfg);
      j["decoder_sparse_step"] = e.decoder_sparse_step;
      j["mlp_only_layers"] = e.mlp_only_layers;
      j["norm_topk_prob"] = e.normalize_topk;
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      break;
    case Family::kGptOss:
      j["num_local_experts"] = e.num_experts;
      j["intermediate_size"] = config::expert_hidden_size(cfg);
      j["attention_bias"] = true;
      j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
      j["layer_types"] = gpt_oss_layer_types(cfg);
      j["swiglu_limit"] = e.swiglu_limit;
      j["swiglu_alpha"] = e.swiglu_alpha;
      break;
    case Family::kGlm4Moe:
      j["n_routed_experts"] = e.num_experts;
      j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
      j["intermediate_size"] = config::dense_hidden_size(cfg);
      j["first_k_dense_replace"] = first_dense_layers(cfg);
      j["n_shared_experts"] = e.shared_expert_hidden_size / config::expert_hidden_size(cfg);
      j["norm_topk_prob"] = e.normalize_topk;
      j["n_group"] = e.n_group;
      j["topk_group"] = e.topk_group;
      j["routed_scaling_factor"] = e.routed_scaling_factor;
      j["use_qk_norm"] = m.qk_norm;
      j["attention_bias"] = m.qkv_bias;
      j["partial_rotary_factor"] = m.partial_rotary_factor;
      j["rope_parameters"]["partial_rotary_factor"] = m.partial_rotary_factor;
      j["num_nextn_predict_layers"] = 0;  // the MTP layers are not imported (docs/hf.md)
      j.erase("router_aux_loss_coef");
      break;
    case Family::kDeepseekV2:
    case Family::kDeepseekV3:
      deepseek_keys_to_hf(cfg, f, j);
      break;
    case Family::kOlmoe:
      j["num_experts"] = e.num_experts;
      j["intermediate_size"] = config::expert_hidden_size(cfg);
      j["norm_topk_prob"] = e.normalize_topk;
      j["attention_bias"] = false;
      j["clip_qkv"] = m.clip_qkv > 0 ? json(m.clip_qkv) : json(nullptr);
      break;
  }
}

json hf_config_from(const config::Config& cfg, Family f, const json& base, const std::string& dtype,
                    std::vector<std::string>* warnings) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  json j = base.is_object() ? base : json::object();
  // rope_scaling and a top-level original_max_position_embeddings (which transformers reads
  // over the rope dict's) are rewritten from the checkpoint's model.rope_scaling below.
  // quantization_config: the exported weights are 16- or 32-bit whatever the base was stored in
  // (MXFP4, bitsandbytes 4-bit); transformers would read them as quantized otherwise.
  for (const char* stale : {"rope_scaling", "original_max_position_embeddings", "torch_dtype",
                            "dtype", "transformers_version", "num_local_experts", "num_experts",
                            "moe_intermediate_size", "quantization_config", "n_routed_experts"}) {
    j.erase(stale);
  }
  j["architectures"] = {architecture_name(f)};
  j["model_type"] = model_type(f);
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = config::key_value_heads(cfg);
  if (f != Family::kOlmoe && !deepseek(f)) j["head_dim"] = config::head_dim(cfg);
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_parameters"] = rope_parameters(m);
  // transformers 4.x reads these two (5.x reads rope_parameters, or a non-empty rope_scaling,
  // taking rope_theta from the top level). 4.x warns about keys it does not know in rope_scaling:
  // rope_theta is left out, and truncate too where it is the default.
  j["rope_theta"] = m.rope_theta;
  if (m.rope_scaling.type != config::RopeScalingType::kNone) {
    json legacy = j["rope_parameters"];
    legacy.erase("rope_theta");
    if (m.rope_scaling.truncate) legacy.erase("truncate");
    j["rope_scaling"] = legacy;
  }
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  j["initializer_range"] = m.init_std;
  j["attention_dropout"] = 0.0;
  if (!j.contains("max_position_embeddings")) j["max_position_embeddings"] = m.seq_len;
  if (m.rope_scaling.type == config::RopeScalingType::kYarn) {
    // The scaled window. Some transformers 4.x releases compute yarn's factor as
    // max_position_embeddings / original_max_position_embeddings, ignoring `factor`; 5.x warns
    // when the two disagree. factor x original serves both.
    const auto& s = m.rope_scaling;
    const int64_t window = yarn_window(s);
    const double exact = s.factor * double(s.original_max_position_embeddings);
    const int64_t before =
        j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer()
            ? j["max_position_embeddings"].get<int64_t>()
            : 0;
    j["max_position_embeddings"] = window;
    if (warnings != nullptr && exact != double(window)) {
      warnings->push_back(
          "model.rope_scaling.factor x original_max_position_embeddings = " + json(exact).dump() +
          " is not a whole number: config.json gets max_position_embeddings = " +
          std::to_string(window) + ", whose ratio to the original window (the factor some " +
          "transformers 4.x releases use; 5.x warns of it) is not the trained factor; a factor " +
          "that makes a whole window avoids this");
    }
    if (warnings != nullptr && before > window) {
      warnings->push_back("max_position_embeddings lowered from the base's " +
                          std::to_string(before) + " to " + std::to_string(window) +
                          " (model.rope_scaling.factor x original_max_position_embeddings, "
                          "YaRN's scaled window)");
    }
  }
  j["num_experts_per_tok"] = e.top_k;
  j["router_aux_loss_coef"] = e.aux_loss_coeff;
  j["output_router_logits"] = false;
  family_keys_to_hf(cfg, f, j);
  j["dtype"] = dtype;
  j["torch_dtype"] = dtype;
  return j;
}

}  // namespace moe::hf
