// Qwen3-Next and Qwen3.5 / Qwen3.6 MoE (transformers' Qwen3NextConfig, Qwen3_5MoeTextConfig):
// hybrids of Gated DeltaNet layers (layer_types "linear_attention", every layer but each
// full_attention_interval-th) and gated attention layers (an output gate per head in q_proj,
// per-head q/k norms, partial rotary 0.25), zero-centred RMSNorms, softmax top-k experts with a
// sigmoid-gated shared expert. Qwen3-Next fuses the linear-attention input projections per key
// head (in_proj_qkvz, in_proj_ba) and may have dense layers (mlp_only_layers,
// decoder_sparse_step); Qwen3.5 splits them (in_proj_qkv, _z, _b, _a), every layer MoE, the top-k
// weights always renormalised.
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

// Qwen3-Next; Qwen3.5-MoE's text model; Qwen3.5-MoE as released, a vision-language model whose
// text model trains while its vision tower is carried through to the export.
enum class Kind { kNext, kText, kVisionLanguage };

class Qwen3Hybrid final : public ModelFamily {
 public:
  explicit Qwen3Hybrid(Kind kind) : kind_(kind), next_(kind == Kind::kNext) {}

  const char* model_type() const override {
    return next_ ? "qwen3_next" : vl() ? "qwen3_5_moe" : "qwen3_5_moe_text";
  }
  const char* architecture() const override {
    return next_  ? "Qwen3NextForCausalLM"
           : vl() ? "Qwen3_5MoeForConditionalGeneration"
                  : "Qwen3_5MoeForCausalLM";
  }
  const char* title() const override {
    return next_ ? "Qwen3-Next" : vl() ? "Qwen3.5-MoE (vision-language)" : "Qwen3.5-MoE";
  }
  const char* releases() const override {
    return next_  ? "Qwen3-Next-80B-A3B"
           : vl() ? "Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B as released (vision tower carried)"
                  : "Qwen3.5-35B-A3B, Qwen3.5-122B-A10B, Qwen3.5-397B-A17B, Qwen3.6 MoE (text)";
  }
  const char* text_config_key() const override { return vl() ? "text_config" : nullptr; }
  const char* text_family() const override { return vl() ? "qwen3_5_moe_text" : nullptr; }
  const char* hf_model_prefix() const override { return vl() ? "model.language_model." : "model."; }
  bool carried_tensor(const std::string& hf) const override {
    return vl() && hf.compare(0, 13, "model.visual.") == 0;
  }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kLinearAttention:
      case Feature::kAttentionOutputGate:
      case Feature::kZeroCenteredNorm:
      case Feature::kSharedExperts:
      case Feature::kSharedExpertGate:
      case Feature::kQkNorm:
      case Feature::kPartialRotary:
        return true;
      case Feature::kDenseLayers:
        return next_;
      default:
        return false;
    }
  }
  double default_partial_rotary_factor() const override { return 0.25; }
  bool has_mtp_layers() const override { return true; }  // mtp.* (skipped on import)

  // 3 Gated DeltaNet layers and 1 attention layer; two value heads per key head.
  json tiny_config() const override {
    if (vl()) {  // the text model's keys under text_config, a (tiny) vision tower's beside them
      json text = Qwen3Hybrid(Kind::kText).tiny_config();
      text.erase("architectures");
      text["model_type"] = "qwen3_5_moe_text";
      return json({{"architectures", {architecture()}},
                   {"model_type", model_type()},
                   {"text_config", text},
                   {"vision_config", {{"depth", 1}, {"hidden_size", 32}, {"out_hidden_size", 64}}},
                   {"tie_word_embeddings", false}});
    }
    json c = tiny_common_keys();
    c.update(
        json({{"architectures", {architecture()}},
              {"num_hidden_layers", 4},
              {"head_dim", 32},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 4},
              {"linear_key_head_dim", 16},
              {"linear_value_head_dim", 16},
              {"linear_conv_kernel_dim", 4},
              {"num_experts", 4},
              {"moe_intermediate_size", 32},
              {"shared_expert_intermediate_size", 48},
              {"rope_parameters", {{"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}}}}));
    if (next_) c.update(json({{"intermediate_size", 80}, {"mlp_only_layers", {2}}}));
    return c;
  }

  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    const int64_t layers = k.integer("num_hidden_layers");
    std::vector<std::string> types = k.strings("layer_types", "layer types");
    if (types.empty()) {  // transformers' rule: every interval-th layer attends
      const int64_t interval = k.integer("full_attention_interval", 4);
      if (interval == 0) k.fail("full_attention_interval", "expected a positive integer");
      for (int64_t i = 0; i < layers; ++i) {
        types.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
      }
    }
    if (static_cast<int64_t>(types.size()) != layers) {
      k.fail("layer_types",
             "needs one entry per layer (num_hidden_layers = " + std::to_string(layers) + ")");
    }
    for (const auto& t : types) {
      if (t != "full_attention" && t != "linear_attention") {
        k.fail("layer_types", "expected full_attention or linear_attention, got " + t);
      }
    }
    m["layer_types"] = types;
    if (!k.boolean("attn_output_gate", true)) {
      k.fail("attn_output_gate", "only gated attention (true) is supported");
    }
    m["linear_num_key_heads"] = k.integer("linear_num_key_heads");
    m["linear_num_value_heads"] = k.integer("linear_num_value_heads");
    m["linear_key_head_dim"] = k.integer("linear_key_head_dim");
    m["linear_value_head_dim"] = k.integer("linear_value_head_dim");
    m["linear_conv_kernel_dim"] = k.integer("linear_conv_kernel_dim", 4);
    m["linear_fused_projections"] = next_;
    m["attention_output_gate"] = true;
    m["zero_centered_norm"] = true;
    m["qk_norm"] = true;
    m["qk_norm_scope"] = "head";
    e["num_experts"] = k.integer("num_experts");
    e["expert_hidden_size"] = k.integer("moe_intermediate_size");
    e["shared_expert_hidden_size"] = k.integer("shared_expert_intermediate_size");
    e["shared_expert_gate"] = true;
    if (next_) {
      m["dense_hidden_size"] = k.integer("intermediate_size");
      e["decoder_sparse_step"] = k.integer("decoder_sparse_step", 1);
      e["mlp_only_layers"] = k.integers("mlp_only_layers");
      e["normalize_topk"] = k.boolean("norm_topk_prob", true);
    } else {
      e["normalize_topk"] = true;  // Qwen3.5's router always renormalises
    }
  }

  // The vision-language form is never guessed: export-hf writes it when the checkpoint was
  // imported from one (its config.json and vision tower come from there) or --architecture says.
  int claim(const config::Config& cfg) const override {
    if (cfg.model.linear_num_key_heads == 0 || vl()) return 0;
    return cfg.model.linear_fused_projections == next_ ? 100 : 0;  // no other family has it
  }
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    const std::string who = title();
    if (m.linear_fused_projections != next_) {
      throw UserError(std::string("model.linear_fused_projections: ") + who + " saves them " +
                      (next_ ? "fused (true)" : "split (false)"));
    }
    if (!m.attention_output_gate || !m.zero_centered_norm || !m.qk_norm ||
        m.qk_norm_scope != config::QkNormScope::kHead) {
      throw UserError("model.attention_output_gate: " + who +
                      " has gated attention, zero-centred norms and per-head q/k norms");
    }
    if (cfg.moe.shared_expert_hidden_size == 0 || !cfg.moe.shared_expert_gate) {
      throw UserError("moe.shared_expert_gate: " + who + " has a sigmoid-gated shared expert");
    }
    if (!next_) {
      require_all_moe(cfg, who);
      if (!cfg.moe.normalize_topk) {
        throw UserError("moe.normalize_topk: " + who + " always renormalises the top-k weights");
      }
    }
  }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    std::vector<std::string> types;
    for (int64_t i = 0; i < m.num_layers; ++i) {
      types.push_back(config::linear_attention_layer(cfg, i) ? "linear_attention"
                                                             : "full_attention");
    }
    j["layer_types"] = types;
    j.erase("full_attention_interval");
    j["linear_num_key_heads"] = m.linear_num_key_heads;
    j["linear_num_value_heads"] = m.linear_num_value_heads;
    j["linear_key_head_dim"] = m.linear_key_head_dim;
    j["linear_value_head_dim"] = m.linear_value_head_dim;
    j["linear_conv_kernel_dim"] = m.linear_conv_kernel_dim;
    j["num_experts"] = cfg.moe.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["shared_expert_intermediate_size"] = cfg.moe.shared_expert_hidden_size;
    j["attention_bias"] = false;
    if (next_) {
      j["intermediate_size"] = config::dense_hidden_size(cfg);
      j["decoder_sparse_step"] = cfg.moe.decoder_sparse_step;
      j["mlp_only_layers"] = cfg.moe.mlp_only_layers;
      j["norm_topk_prob"] = cfg.moe.normalize_topk;
    }
    // The partial rotary factor goes in rope_parameters (transformers 5's place for it).
    j["rope_parameters"]["partial_rotary_factor"] = m.partial_rotary_factor;
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    ExpertNames names;
    names.shared = "shared_expert.";
    split_expert_tensors(cfg, hf_layer, our_layer, names, out);
  }

 private:
  bool vl() const { return kind_ == Kind::kVisionLanguage; }
  Kind kind_;
  bool next_;
};

}  // namespace

void register_qwen3_next_family(std::vector<const ModelFamily*>& out) {
  static const Qwen3Hybrid kQwen3Next(Kind::kNext), kQwen35Moe(Kind::kText),
      kQwen35MoeVl(Kind::kVisionLanguage);
  out.push_back(&kQwen3Next);
  out.push_back(&kQwen35Moe);
  out.push_back(&kQwen35MoeVl);
}

}  // namespace moe::families
