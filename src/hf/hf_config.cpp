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
};

// Typed reads of config.json keys; every error names the file and the key.
class HfKeys {
 public:
  HfKeys(const json& c, std::string file) : c_(c), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const std::string value = c_.contains(key) ? " = " + c_[key].dump() : "";
    throw UserError("hf: " + file_ + ": " + key + value + ": " + what);
  }
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
  const json& raw(const std::string& key) const { return c_[key]; }

 private:
  const json& c_;
  std::string file_;
};

// Rotary base from rope_parameters (transformers 5) or rope_theta (4.x); only the default
// (unscaled) rotary embedding is what our attention computes.
double rope_theta(const HfKeys& k, double family_default) {
  if (k.present("rope_parameters")) {
    const json& p = k.raw("rope_parameters");
    if (!p.is_object()) k.fail("rope_parameters", "expected an object");
    const std::string type = p.value("rope_type", std::string("default"));
    if (type != "default") {
      k.fail("rope_parameters", "rope_type \"" + type + "\" is not supported (only \"default\")");
    }
    if (p.contains("rope_theta")) {
      if (!p["rope_theta"].is_number()) k.fail("rope_parameters", "rope_theta must be a number");
      return p["rope_theta"].get<double>();
    }
  }
  if (k.present("rope_scaling")) {
    const json& s = k.raw("rope_scaling");
    const std::string type =
        s.is_object() ? s.value("rope_type", s.value("type", std::string("default"))) : "?";
    if (type != "default") k.fail("rope_scaling", "scaled rotary embeddings are not supported");
  }
  return k.number("rope_theta", family_default);
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
                  "\" is not supported: expected MixtralForCausalLM, Qwen3MoeForCausalLM or "
                  "OlmoeForCausalLM");
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
  if (k.boolean("attention_bias", false)) k.fail("attention_bias", "biases are not supported");
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
  m["rope_theta"] = rope_theta(k, family == Family::kMixtral ? 1e6 : 1e4);
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
  if (e["top_k"].get<int64_t>() == 1 && e["normalize_topk"].get<bool>()) {
    k.fail("num_experts_per_tok",
           "top-1 routing with renormalised weights (a weight of exactly 1) is not supported");
  }
  return {{"model", m}, {"moe", e}};
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
  if (e.shared_expert_hidden_size > 0) {
    refuse("moe.shared_expert_hidden_size", "shared experts are not in these families");
  }
  if (e.score_function != config::ScoreFunction::kSoftmax) {
    refuse("moe.score_function", "these families route with softmax scores");
  }
  if (e.router_bias_update_rate > 0) {
    refuse("moe.router_bias_update_rate", "these families have no expert selection bias");
  }
  if (e.top_k == 1 && e.normalize_topk) {
    refuse("moe.top_k", "1 with moe.normalize_topk: HF renormalises a single weight to 1");
  }
  Family f = Family::kMixtral;
  if (!requested.empty()) {
    f = parse_family(requested, "export-hf: --architecture");
  } else if (m.qk_norm) {
    f = m.qk_norm_scope == config::QkNormScope::kFull ? Family::kOlmoe : Family::kQwen3Moe;
  }
  const bool all_moe = config::moe_layer_count(cfg) == m.num_layers;
  switch (f) {
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
  }
  return f;
}

json hf_config_from(const config::Config& cfg, Family f, const json& base,
                    const std::string& dtype) {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  json j = base.is_object() ? base : json::object();
  for (const char* stale : {"rope_scaling", "torch_dtype", "dtype", "transformers_version",
                            "num_local_experts", "num_experts", "moe_intermediate_size"}) {
    j.erase(stale);
  }
  j["architectures"] = {architecture_name(f)};
  j["model_type"] = model_type(f);
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = config::key_value_heads(cfg);
  if (f != Family::kOlmoe) j["head_dim"] = config::head_dim(cfg);
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  j["initializer_range"] = m.init_std;
  j["attention_dropout"] = 0.0;
  if (!j.contains("max_position_embeddings")) j["max_position_embeddings"] = m.seq_len;
  j["num_experts_per_tok"] = e.top_k;
  j["router_aux_loss_coef"] = e.aux_loss_coeff;
  j["output_router_logits"] = false;
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
    case Family::kOlmoe:
      j["num_experts"] = e.num_experts;
      j["intermediate_size"] = config::expert_hidden_size(cfg);
      j["norm_topk_prob"] = e.normalize_topk;
      j["attention_bias"] = false;
      j["clip_qkv"] = m.clip_qkv > 0 ? json(m.clip_qkv) : json(nullptr);
      break;
  }
  j["dtype"] = dtype;
  j["torch_dtype"] = dtype;
  return j;
}

}  // namespace moe::hf
