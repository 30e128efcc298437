// Gemma 4 MoE (transformers' Gemma4TextConfig with enable_moe_block; gemma-4-26B-A4B): sliding
// and full-attention layers, the full ones with their own head width (global_head_dim), kv heads
// and proportional rotary, K reused as V there (attention_k_eq_v); q/k norms, a weightless v
// norm, a softmax scale of 1; sandwich norms; in every layer a dense GeGLU MLP beside the routed
// GeGLU experts (moe.parallel_dense), whose router normalises the residual itself and scales
// each expert's weight; a per-layer output scalar; embeddings times sqrt(hidden); final logit
// soft-capping. The experts are saved fused (experts.gate_up_proj [E, 2f, d], down_proj
// [E, d, f]); the router as router.proj / router.scale / router.per_expert_scale. The release
// (Gemma4ForConditionalGeneration) holds the same text model under model.language_model.
#include <cmath>

#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

// transformers' default: every sixth layer full attention, and the last one always.
std::vector<std::string> default_layer_types(int64_t layers) {
  std::vector<std::string> types;
  for (int64_t i = 0; i < layers; ++i) {
    types.push_back((i + 1) % 6 != 0 ? "sliding_attention" : "full_attention");
  }
  if (!types.empty()) types.back() = "full_attention";
  return types;
}

class Gemma4Text final : public ModelFamily {
 public:
  const char* model_type() const override { return "gemma4_text"; }
  const char* architecture() const override { return "Gemma4ForCausalLM"; }
  const char* title() const override { return "Gemma 4 (MoE)"; }
  const char* releases() const override { return "gemma-4-26B-A4B (text model)"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kSlidingWindow:
      case Feature::kQkNorm:
      case Feature::kGlobalAttention:
      case Feature::kValueNorm:
      case Feature::kAttentionScale:
      case Feature::kScaledEmbeddings:
      case Feature::kLogitSoftcap:
      case Feature::kSandwichNorms:
      case Feature::kLayerScalar:
      case Feature::kParallelDense:
      case Feature::kRouterInputNorm:
      case Feature::kGeglu:
        return true;
      default:
        return false;
    }
  }

  json tiny_config() const override {
    json c = tiny_common_keys();
    c.erase("num_experts_per_tok");
    c.update(json({{"architectures", {"Gemma4ForCausalLM"}},
                   {"model_type", "gemma4_text"},
                   {"head_dim", 16},
                   {"global_head_dim", 32},
                   {"num_global_key_value_heads", 1},
                   {"attention_k_eq_v", true},
                   {"layer_types", {"sliding_attention", "sliding_attention", "full_attention"}},
                   {"sliding_window", 8},
                   {"intermediate_size", 48},
                   {"enable_moe_block", true},
                   {"num_experts", 4},
                   {"top_k_experts", 2},
                   {"moe_intermediate_size", 32},
                   {"hidden_size_per_layer_input", 0},
                   {"final_logit_softcapping", 30.0},
                   {"tie_word_embeddings", true}}));
    return c;
  }

  double default_rope_theta() const override { return 1e4; }
  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    refuse_other_variants(k);
    const int64_t layers = m["num_layers"].get<int64_t>();
    const auto types = k.present("layer_types") ? k.strings("layer_types", "layer types")
                                                : default_layer_types(layers);
    if (static_cast<int64_t>(types.size()) != layers) {
      k.fail("layer_types", "expected one entry per layer (" + std::to_string(layers) + ")");
    }
    for (const auto& t : types) {
      if (t != "sliding_attention" && t != "full_attention") {
        k.fail("layer_types", "\"" + t + "\": expected sliding_attention or full_attention");
      }
    }
    m["layer_types"] = types;
    m["sliding_window"] = k.integer("sliding_window", 512);
    m["head_dim"] = k.integer("head_dim", 256);
    m["num_key_value_heads"] = k.integer("num_key_value_heads", 4);
    read_global_shape(k, types, m);
    read_rotary(k, m);
    m["qk_norm"] = true;
    m["value_norm"] = true;
    m["attention_scale"] = 1.0;
    m["scale_embeddings"] = true;
    m["sandwich_norms"] = true;
    m["layer_scalar"] = true;
    m["final_logit_softcapping"] = k.number("final_logit_softcapping", 0.0);
    m["tie_embeddings"] = k.boolean("tie_word_embeddings", true);
    m["dense_hidden_size"] = k.integer("intermediate_size", 9216);
    e["num_experts"] = k.integer("num_experts");
    e["top_k"] = k.integer("top_k_experts");
    e["expert_hidden_size"] = k.integer("moe_intermediate_size");
    e["score_function"] = "softmax";
    e["normalize_topk"] = true;
    e["activation"] = "geglu";
    e["parallel_dense"] = true;
    e["router_input_norm"] = true;
    e["per_expert_scale"] = true;
    // transformers' Gemma 4 trains with no load-balancing loss.
    e["aux_loss_coeff"] = k.number("router_aux_loss_coef", 0.0);
    if (warnings != nullptr && k.string("use_bidirectional_attention", "") == "vision") {
      warnings->push_back(
          "use_bidirectional_attention \"vision\" matters for image tokens only: the text model "
          "attends causally");
    }
  }

  // The parallel dense + MoE block with its own router: Gemma 4 alone.
  int claim(const config::Config& cfg) const override { return cfg.moe.parallel_dense ? 100 : 0; }
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    const auto need = [](bool ok, const char* key, const char* what) {
      if (!ok) throw UserError(std::string(key) + ": Gemma 4 " + what);
    };
    need(e.parallel_dense && e.router_input_norm && e.per_expert_scale, "moe.parallel_dense",
         "runs a dense MLP beside the experts (true), its router with router_input_norm and "
         "per_expert_scale");
    need(e.activation == config::ExpertActivation::kGeglu, "moe.activation", "uses geglu");
    need(e.score_function == config::ScoreFunction::kSoftmax && e.normalize_topk,
         "moe.score_function", "routes with softmax scores, renormalised");
    need(m.qk_norm && m.qk_norm_scope == config::QkNormScope::kHead && m.value_norm,
         "model.qk_norm", "normalises q and k per head (true) and v (model.value_norm true)");
    need(m.attention_scale == 1.0, "model.attention_scale", "scales q . k by 1");
    need(m.scale_embeddings && m.sandwich_norms && m.layer_scalar, "model.sandwich_norms",
         "has sandwich norms, scaled embeddings and layer scalars (all true)");
    need(!m.zero_centered_norm, "model.zero_centered_norm", "stores its norms' weights as is");
    need(m.partial_rotary_factor == 1.0 && m.rope_scaling.type == config::RopeScalingType::kNone,
         "model.rope_scaling", "rotates whole heads on sliding layers without scaling");
    need(moe_layers_everywhere(cfg), "moe.mlp_only_layers", "has experts in every layer");
    need(!m.layer_types.empty(), "model.layer_types", "names each layer's attention");
    need(!m.attention_k_eq_v || m.global_num_key_value_heads > 0,
         "model.global_num_key_value_heads", "sets it where the keys are the values");
  }
  bool writes_head_dim() const override { return true; }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    for (const char* stale : {"rope_theta", "rope_scaling", "hidden_act", "num_experts_per_tok",
                              "router_aux_loss_coef"}) {
      j.erase(stale);
    }
    j["layer_types"] = m.layer_types;
    j["sliding_window"] = m.sliding_window;
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["enable_moe_block"] = true;
    j["num_experts"] = e.num_experts;
    j["top_k_experts"] = e.top_k;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["hidden_size_per_layer_input"] = 0;
    j["num_kv_shared_layers"] = 0;
    j["use_double_wide_mlp"] = false;
    j["attention_bias"] = false;
    j["attention_k_eq_v"] = m.attention_k_eq_v;
    j["final_logit_softcapping"] =
        m.final_logit_softcapping > 0 ? json(m.final_logit_softcapping) : json(nullptr);
    const double global_theta = m.global_rope_theta > 0 ? m.global_rope_theta : m.rope_theta;
    j["rope_parameters"] = {
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", m.rope_theta}}},
        {"full_attention",
         {{"rope_type", "proportional"},
          {"partial_rotary_factor", m.global_partial_rotary_factor},
          {"rope_theta", global_theta}}}};
    // transformers 5.25 reads per_layer_config (and writes no global_head_dim); older releases
    // read the two plain keys. Both say the same.
    const int64_t global_hd = m.global_head_dim > 0 ? m.global_head_dim : config::head_dim(cfg);
    json per_layer = json::object();
    for (int64_t i = 0; i < m.num_layers; ++i) {
      if (!config::global_attention_layer(cfg, i)) continue;
      json o = {{"head_dim", global_hd}};
      if (m.attention_k_eq_v) o["num_key_value_heads"] = config::layer_key_value_heads(cfg, i);
      per_layer[std::to_string(i)] = o;
    }
    j["per_layer_config"] = per_layer;
    j["global_head_dim"] = global_hd;
    if (m.attention_k_eq_v) j["num_global_key_value_heads"] = m.global_num_key_value_heads;
  }

  const char* experts_module() const override { return "experts."; }
  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    const std::string router = hf_layer + "router.", mine = our_layer + "moe.";
    out.push_back({router + "proj.weight", mine + "router.weight"});
    out.push_back({router + "scale", mine + "router.input_scale"});
    out.push_back({router + "per_expert_scale", mine + "router.expert_scale"});
    fused_expert_tensors(cfg, hf_layer + experts_module(), our_layer, out);
  }

 private:
  // What this family does not read: the dense and per-layer-embedding variants.
  static void refuse_other_variants(const HfKeys& k) {
    if (!k.boolean("enable_moe_block", false)) {
      k.fail("enable_moe_block",
             "a dense Gemma 4 (31B, E2B, E4B) is not an MoE: only the MoE variant (true) is "
             "supported");
    }
    if (k.integer("hidden_size_per_layer_input", 256) != 0) {
      k.fail("hidden_size_per_layer_input",
             "per-layer input embeddings (Gemma 4 E2B / E4B) are not supported (0 is)");
    }
    if (k.integer("num_kv_shared_layers", 0) != 0) {
      k.fail("num_kv_shared_layers", "key/value sharing across layers is not supported (0 is)");
    }
    if (k.boolean("use_double_wide_mlp", false)) {
      k.fail("use_double_wide_mlp", "not supported (false is)");
    }
    if (k.string("use_bidirectional_attention", "") == "all") {
      k.fail("use_bidirectional_attention", "\"all\" (non-causal) is not supported");
    }
    const std::string act = k.string("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh")
      k.fail("hidden_activation", "only gelu_pytorch_tanh is supported");
  }

  // Full-attention layers' head width and kv heads: transformers 5.25's per_layer_config, or the
  // plain keys global_head_dim (default 512) and num_global_key_value_heads (with K=V only).
  static void read_global_shape(const HfKeys& k, const std::vector<std::string>& types, json& m) {
    const bool k_eq_v = k.boolean("attention_k_eq_v", false);
    m["attention_k_eq_v"] = k_eq_v;
    int64_t hd = 0, kv = 0;
    if (k.present("per_layer_config")) {
      const json& per = k.raw("per_layer_config");
      if (!per.is_object()) k.fail("per_layer_config", "expected an object of layer overrides");
      bool first = true;
      for (const auto& [layer, o] : per.items()) {
        size_t used = 0;
        int64_t i = -1;
        try {
          i = std::stoll(layer, &used);
        } catch (const std::exception&) {
        }
        if (used != layer.size() || i < 0 || i >= static_cast<int64_t>(types.size()) ||
            types[static_cast<size_t>(i)] != "full_attention" || !o.is_object()) {
          k.fail_field("per_layer_config", layer,
                       "expected the overrides of a full_attention layer");
        }
        const int64_t h = o.value("head_dim", int64_t{0}), n = o.value("num_key_value_heads", 0);
        if (!first && (h != hd || n != kv)) {
          k.fail_field("per_layer_config", layer,
                       "full-attention layers of different shapes are not supported");
        }
        hd = h, kv = n, first = false;
      }
    } else {
      hd = k.integer("global_head_dim", 512);
      kv = k_eq_v ? k.integer("num_global_key_value_heads", 0) : 0;
    }
    m["global_head_dim"] = hd;
    m["global_num_key_value_heads"] = kv;
  }

  // rope_parameters keyed by layer type: sliding layers "default", full ones "proportional".
  static void read_rotary(const HfKeys& k, json& m) {
    double sliding_theta = 1e4, full_theta = 1e6, full_factor = 0.25;
    if (k.present("rope_parameters")) {
      const json& p = k.raw("rope_parameters");
      const auto part = [&](const char* type) -> const json* {
        if (!p.is_object() || !p.contains(type)) return nullptr;
        if (!p[type].is_object()) k.fail_field("rope_parameters", type, "expected an object");
        return &p[type];
      };
      const auto number = [&](const json& o, const char* type, const char* name, double fallback) {
        if (!o.contains(name) || o[name].is_null()) return fallback;
        if (!o[name].is_number()) {
          k.fail_field("rope_parameters", std::string(type) + "." + name, "expected a number");
        }
        return o[name].get<double>();
      };
      if (const json* s = part("sliding_attention")) {
        if (s->value("rope_type", std::string("default")) != "default") {
          k.fail_field("rope_parameters", "sliding_attention.rope_type",
                       "only \"default\" is supported");
        }
        sliding_theta = number(*s, "sliding_attention", "rope_theta", sliding_theta);
      }
      if (const json* f = part("full_attention")) {
        const std::string type = f->value("rope_type", std::string("proportional"));
        if (type != "proportional" && type != "default") {
          k.fail_field("rope_parameters", "full_attention.rope_type",
                       "only \"proportional\" and \"default\" are supported");
        }
        full_theta = number(*f, "full_attention", "rope_theta", full_theta);
        full_factor = number(*f, "full_attention", "partial_rotary_factor", 1.0);
        if (type == "default" && full_factor != 1.0) {
          k.fail_field("rope_parameters", "full_attention.partial_rotary_factor",
                       "only 1 is supported with rope_type \"default\"");
        }
        if (number(*f, "full_attention", "factor", 1.0) != 1.0) {
          k.fail_field("rope_parameters", "full_attention.factor", "only 1 is supported");
        }
      }
    }
    m["rope_theta"] = sliding_theta;
    m["global_rope_theta"] = full_theta;
    m["global_partial_rotary_factor"] = full_factor;
  }

  static bool moe_layers_everywhere(const config::Config& cfg) {
    return config::moe_layer_count(cfg) == cfg.model.num_layers;
  }
};

// Gemma 4 as released: Gemma4ForConditionalGeneration, the text model above under
// model.language_model.* (its keys under text_config), the vision (and audio) towers beside it,
// carried through training and written back as imported.
class Gemma4Release final : public ModelFamily {
 public:
  explicit Gemma4Release(const Gemma4Text& text) : text_(text) {}
  const char* model_type() const override { return "gemma4"; }
  const char* architecture() const override { return "Gemma4ForConditionalGeneration"; }
  const char* title() const override { return "Gemma 4 MoE (as released)"; }
  const char* releases() const override {
    return "gemma-4-26B-A4B, gemma-4-26B-A4B-it (vision tower carried)";
  }
  bool has(Feature f) const override { return text_.has(f); }
  json tiny_config() const override {
    json text = text_.tiny_config();
    text.erase("architectures");
    return json({{"architectures", {architecture()}},
                 {"model_type", model_type()},
                 {"text_config", text},
                 {"tie_word_embeddings", true}});
  }
  double default_rope_theta() const override { return text_.default_rope_theta(); }
  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    text_.read_config(k, m, e, warnings);
  }
  int claim(const config::Config&) const override { return 0; }  // written for its imports only
  void check_export(const config::Config& cfg) const override { text_.check_export(cfg); }
  void write_config(const config::Config& cfg, json& j) const override {
    text_.write_config(cfg, j);
  }
  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    text_.moe_tensors(cfg, hf_layer, our_layer, out);
  }
  const char* experts_module() const override { return text_.experts_module(); }
  const char* text_config_key() const override { return "text_config"; }
  const char* text_family() const override { return "gemma4_text"; }
  const char* hf_model_prefix() const override { return "model.language_model."; }
  bool carried_tensor(const std::string& hf) const override {
    for (const char* part : {"model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                             "model.embed_audio."}) {
      if (hf.rfind(part, 0) == 0) return true;
    }
    return false;
  }

 private:
  const Gemma4Text& text_;
};

}  // namespace

void register_gemma4_family(std::vector<const ModelFamily*>& out) {
  static const Gemma4Text kGemma4Text;
  static const Gemma4Release kGemma4Release(kGemma4Text);
  out.push_back(&kGemma4Text);
  out.push_back(&kGemma4Release);
}

}  // namespace moe::families
