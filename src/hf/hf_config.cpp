#include "moe/hf/hf_config.h"

#include <algorithm>
#include <cmath>

#include "moe/families/hf_keys.h"
#include "moe/hf/hf_rope_keys.h"
#include "moe/util/errors.h"

namespace moe::hf {

using families::Feature;
using families::HfKeys;
using families::ModelFamily;
using nlohmann::json;

namespace {

// The training window: the model's max_position_embeddings up to kImportSeqLenCap (a 32k window
// by default would surprise a fine-tune with its memory; rotary models train and evaluate at any
// model.seq_len the run config sets). Never silent: the import says so.
int64_t training_window(int64_t max_positions, std::vector<std::string>* warnings) {
  if (max_positions > kImportSeqLenCap && warnings != nullptr) {
    warnings->push_back(
        "model.seq_len = " + std::to_string(kImportSeqLenCap) + " (max_position_embeddings is " +
        std::to_string(max_positions) +
        "; set model.seq_len in the training config for longer windows, and see "
        "what they cost with moe-train plan); exports keep max_position_embeddings");
  }
  return std::min<int64_t>(max_positions, kImportSeqLenCap);
}

// The families whose attention has biases, for the refusal of the others'.
std::string with_biases() {
  std::vector<const ModelFamily*> owners;
  for (const ModelFamily* f : families::all_families()) {
    if (f->has(Feature::kAttentionBias) || f->has(Feature::kQkvBias)) owners.push_back(f);
  }
  return families::listed(owners, true, "and");
}

}  // namespace

namespace {

// The width, heads and embedding keys every family shares, as our model section.
json attention_and_embedding_keys(const HfKeys& k) {
  const int64_t hidden = k.integer("hidden_size"), heads = k.integer("num_attention_heads");
  // Latent attention gives its head widths explicitly (GLM-4.7-Flash: 20 heads on 2048).
  const bool latent = k.present("kv_lora_rank") && k.integer("kv_lora_rank", 0) > 0;
  if (heads == 0 || (hidden % heads != 0 && !latent)) {
    if (!k.present("head_dim")) k.fail("num_attention_heads", "must divide hidden_size");
  }
  json m;
  m["vocab_size"] = k.integer("vocab_size");
  m["hidden_size"] = hidden;
  // Nemotron-H derives its depth from layers_block_type (its read_config sets it).
  m["num_layers"] = k.integer("num_hidden_layers", 0);
  m["num_heads"] = heads;
  m["num_key_value_heads"] = k.integer("num_key_value_heads", heads);
  m["head_dim"] = k.integer("head_dim", hidden / std::max<int64_t>(heads, 1));
  m["norm_eps"] = k.number("rms_norm_eps", 1e-6);
  m["tie_embeddings"] = k.boolean("tie_word_embeddings", false);
  // Every family's embedding is nn.Embedding(..., padding_idx=pad_token_id): that row is
  // never trained (GLM-4.5's pad is its <|endoftext|>, gpt-oss's <|endoftext|> too).
  if (k.present("pad_token_id") && k.raw("pad_token_id").is_number_integer()) {
    const int64_t pad = k.raw("pad_token_id").get<int64_t>();
    if (pad >= 0 && pad < m["vocab_size"].get<int64_t>()) m["padding_idx"] = pad;
  }
  return m;
}

}  // namespace

json architecture_from_hf(const json& c, const std::string& file, const ModelFamily** family_out,
                          std::vector<std::string>* warnings) {
  if (!c.is_object()) throw UserError("hf: " + file + ": expected a JSON object");
  const HfKeys top(c, file);
  std::string arch;
  if (top.present("architectures")) {
    const json& a = c["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      top.fail("architectures", "expected a list of architecture names");
    }
    arch = a[0].get<std::string>();
  } else {
    arch = top.string("model_type", "");
    if (arch.empty()) top.fail("architectures", "missing (and no model_type)");
  }
  const ModelFamily& family = families::family_named(arch, "hf: " + file + ": architectures:");
  if (family_out != nullptr) *family_out = &family;
  // A vision-language release keeps the text model's keys in an object of their own.
  const char* text_key = family.text_config_key();
  if (text_key != nullptr && !(c.contains(text_key) && c[text_key].is_object())) {
    top.fail(text_key, "expected the text model's settings (an object)");
  }
  const HfKeys k(text_key != nullptr ? c[text_key] : c,
                 text_key != nullptr ? file + ": " + text_key : file);

  if (k.string("hidden_act", "silu") != "silu") k.fail("hidden_act", "only silu is supported");
  if (k.boolean("attention_bias", false) && !family.has(Feature::kAttentionBias) &&
      !family.has(Feature::kQkvBias)) {
    k.fail("attention_bias", "biases are supported for " + with_biases() + " only");
  }
  if (k.boolean("use_sliding_window", false)) {
    k.fail("use_sliding_window", "sliding-window attention is not supported");
  }
  json m = attention_and_embedding_keys(k);
  const RopeSettings rope = rope_settings(k, family.default_rope_theta(),
                                          family.default_partial_rotary_factor(), warnings);
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
  // ERNIE 4.5 names it moe_k (its read_config reads that).
  if (k.present("num_experts_per_tok")) e["top_k"] = k.integer("num_experts_per_tok");
  e["score_function"] = "softmax";
  e["capacity_factor"] = 0.0;
  e["aux_loss_coeff"] = k.number("router_aux_loss_coef", 0.01);
  e["z_loss_coeff"] = 0.0;
  family.read_config(k, m, e, warnings);
  if (m["num_layers"].get<int64_t>() == 0) k.integer("num_hidden_layers");  // fails: missing
  if (!e.contains("top_k")) e["top_k"] = k.integer("num_experts_per_tok");  // fails: missing
  if (e["top_k"].get<int64_t>() == 1 && e["normalize_topk"].get<bool>()) {
    k.fail("num_experts_per_tok",
           "top-1 routing with renormalised weights (a weight of exactly 1) is not supported");
  }
  return {{"model", m}, {"moe", e}};
}

const ModelFamily& export_family(const config::Config& cfg, const std::string& requested) {
  if (config::learned_positions(cfg)) {
    throw UserError(
        "model.rope_theta: 0 (learned positions); the Hugging Face MoE families use rotary");
  }
  if (cfg.moe.top_k == 1 && cfg.moe.normalize_topk) {
    throw UserError("moe.top_k: 1 with moe.normalize_topk: HF renormalises a single weight to 1");
  }
  const ModelFamily& family = requested.empty()
                                  ? families::family_of(cfg)
                                  : families::family_named(requested, "export-hf: --architecture");
  families::refuse_missing_features(cfg, family);
  family.check_export(cfg);
  return family;
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
  if (s.llama_4_scaling_beta > 0) p["llama_4_scaling_beta"] = s.llama_4_scaling_beta;
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

json hf_config_from(const config::Config& cfg, const ModelFamily& family, const json& base,
                    const std::string& dtype, std::vector<std::string>* warnings) {
  if (const char* text_key = family.text_config_key()) {  // the release's config, text model ours
    if (!base.is_object() || !base.contains(text_key) || !base[text_key].is_object()) {
      throw UserError(std::string("export-hf: ") + family.architecture() +
                      " is a vision-language release: export a checkpoint imported from one (its "
                      "config.json and vision tower come from there), or --architecture " +
                      family.text_family() + " for the text model alone");
    }
    json j = base;
    const auto& text = families::family_named(family.text_family(), "export-hf");
    j[text_key] = hf_config_from(cfg, text, base[text_key], dtype, warnings);
    j[text_key].erase("architectures");
    j["architectures"] = {family.architecture()};
    j["model_type"] = family.model_type();
    j["tie_word_embeddings"] = cfg.model.tie_embeddings;
    j.erase("torch_dtype");
    j["dtype"] = dtype;
    return j;
  }
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
  j["architectures"] = {family.architecture()};
  j["model_type"] = family.model_type();
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  j["num_key_value_heads"] = config::key_value_heads(cfg);
  if (family.writes_head_dim()) j["head_dim"] = config::head_dim(cfg);
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_parameters"] = rope_parameters(m);
  // Qwen3.5's multimodal rotary sections: text positions rotate as the 1-D rotary (the same
  // position on every axis), so they pass through untouched for the vision tower's sake.
  if (base.is_object() && base.contains("rope_parameters") && base["rope_parameters"].is_object()) {
    for (const auto& [key, value] : base["rope_parameters"].items()) {
      if (key.rfind("mrope", 0) == 0) j["rope_parameters"][key] = value;
    }
  }
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
  if (m.padding_idx >= 0) j["pad_token_id"] = m.padding_idx;  // transformers' padding_idx again
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
  family.write_config(cfg, j);
  j["dtype"] = dtype;
  j["torch_dtype"] = dtype;
  return j;
}

}  // namespace moe::hf
