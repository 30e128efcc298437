// Mistral Small 4 (transformers' Mistral4Config; its own Mistral4ForCausalLM, which transformers
// 5.25 maps to no causal-LM auto class): DeepSeek-V3's latent attention (rotary on interleaved
// pairs, YaRN with mscale_all_dim) whose queries are scaled past the pretraining window
// (rope_parameters.llama_4_scaling_beta), softmax routing renormalised and scaled, expert groups
// scored by their two best, a shared expert, the first first_k_dense_replace layers dense; the
// routed experts saved fused (experts.gate_up_proj [E, 2f, d], experts.down_proj [E, d, f]).
#include <cmath>

#include "moe/families/latent_attention_keys.h"
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

class Mistral4 final : public ModelFamily {
 public:
  const char* model_type() const override { return "mistral4"; }
  const char* architecture() const override { return "Mistral4ForCausalLM"; }
  const char* title() const override { return "Mistral Small 4"; }
  const char* releases() const override { return "Mistral-Small-4-119B-2603"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kLatentAttention:
      case Feature::kRopeInterleave:
      case Feature::kSharedExperts:
      case Feature::kExpertGroups:
      case Feature::kRoutedScaling:
      case Feature::kDenseLayers:
      case Feature::kQueryPositionScale:
        return true;
      default:
        return false;
    }
  }

  json tiny_config() const override {
    json c = tiny_common_keys();
    c.update(json({{"architectures", {"Mistral4ForCausalLM"}},
                   {"kv_lora_rank", 16},
                   {"q_lora_rank", 24},
                   {"qk_rope_head_dim", 8},
                   {"qk_nope_head_dim", 16},
                   {"v_head_dim", 12},
                   {"moe_intermediate_size", 32},
                   {"intermediate_size", 80},
                   {"n_routed_experts", 4},
                   {"n_shared_experts", 1},
                   {"first_k_dense_replace", 1},
                   {"num_key_value_heads", 4},
                   {"rope_parameters",
                    {{"rope_type", "yarn"},
                     {"rope_theta", 1e4},
                     {"factor", 4.0},
                     {"original_max_position_embeddings", 16},
                     {"mscale_all_dim", 1.0},
                     {"mscale", 1.0},
                     {"llama_4_scaling_beta", 0.1}}}}));
    return c;
  }

  double default_partial_rotary_factor() const override { return 1.0; }  // see read_config
  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    if (k.boolean("attention_bias", false)) {
      k.fail("attention_bias",
             "biases on q_a_proj, kv_a_proj_with_mqa and o_proj are not "
             "supported (Mistral Small 4 has none)");
    }
    if (!k.present("rope_parameters") && !k.present("rope_scaling")) {
      k.fail("rope_parameters",
             "missing (Mistral4Config's default YaRN is not assumed: the "
             "release's config.json names it)");
    }
    read_latent_attention(k, m, {256, 1024, 64, 64, 128, true});
    // transformers' YaRN rotates head_dim x partial_rotary_factor dimensions, which
    // Mistral4Config makes qk_rope_head_dim; ours are qk_rope_head_dim outright.
    const double rope = m["qk_rope_head_dim"].get<double>(),
                 head = rope + m["qk_nope_head_dim"].get<double>();
    const double factor = m["partial_rotary_factor"].get<double>();
    if (factor != 1.0 && std::abs(factor * head - rope) > 1e-6) {
      k.fail("rope_parameters", "partial_rotary_factor " + json(factor).dump() +
                                    " rotates other than qk_rope_head_dim of the " +
                                    json(head).dump() + " query/key dimensions");
    }
    m["partial_rotary_factor"] = 1.0;
    m["dense_hidden_size"] = k.integer("intermediate_size", 12288);
    e["num_experts"] = k.present("n_routed_experts") ? k.integer("n_routed_experts")
                                                     : k.integer("num_local_experts", 128);
    const int64_t f = k.integer("moe_intermediate_size", 2048);
    e["expert_hidden_size"] = f;
    e["mlp_only_layers"] = first_k_dense_layers(k, 0);
    e["shared_expert_hidden_size"] = k.integer("n_shared_experts", 1) * f;
    e["score_function"] = "softmax";
    e["normalize_topk"] = k.boolean("norm_topk_prob", true);
    e["routed_scaling_factor"] = k.number("routed_scaling_factor", 1.0);
    e["n_group"] = k.integer("n_group", 1);
    e["topk_group"] = k.integer("topk_group", 1);
    e["group_score_experts"] = 2;
    e["aux_loss_coeff"] = 0.0;  // transformers' Mistral4 trains without one
  }

  // Latent attention with softmax scores renormalised (DeepSeek-V2 never renormalises), or the
  // query scaling past the window: Mistral Small 4's.
  int claim(const config::Config& cfg) const override {
    if (!config::latent_attention(cfg)) return 0;
    if (cfg.model.rope_scaling.llama_4_scaling_beta > 0) return 120;
    return cfg.moe.score_function == config::ScoreFunction::kSoftmax && cfg.moe.normalize_topk &&
                   cfg.moe.top_k > 1
               ? 110
               : 0;
  }
  void check_export(const config::Config& cfg) const override {
    const auto& e = cfg.moe;
    if (!config::latent_attention(cfg)) {
      throw UserError("model.kv_lora_rank: Mistral Small 4 has multi-head latent attention");
    }
    if (e.score_function != config::ScoreFunction::kSoftmax) {
      throw UserError("moe.score_function: Mistral Small 4 routes with softmax scores");
    }
    if (e.n_group > 1 && e.group_score_experts != 2) {
      throw UserError("moe.group_score_experts: Mistral Small 4 scores a group by its two best");
    }
    const int64_t f = config::expert_hidden_size(cfg);
    if (e.shared_expert_hidden_size == 0 || e.shared_expert_hidden_size % f != 0) {
      throw UserError(
          "moe.shared_expert_hidden_size: Mistral Small 4's shared experts are "
          "n_shared_experts >= 1 x moe_intermediate_size (" +
          std::to_string(f) + ")");
    }
    require_dense_layers_first(cfg, "Mistral Small 4");
  }
  bool writes_head_dim() const override { return false; }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    const int64_t f = config::expert_hidden_size(cfg);
    write_latent_attention(m, j);
    j["rope_interleave"] = m.rope_interleave;
    // transformers 5 only (no 4.x has mistral4): the legacy rope_scaling copy, which 5.x would
    // read over rope_parameters, goes.
    j.erase("rope_scaling");
    j["rope_parameters"]["partial_rotary_factor"] =
        static_cast<double>(m.qk_rope_head_dim) /
        static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim);
    j["n_routed_experts"] = e.num_experts;
    j["moe_intermediate_size"] = f;
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["first_k_dense_replace"] = leading_dense_layers(cfg);
    j["n_shared_experts"] = e.shared_expert_hidden_size / f;
    j["norm_topk_prob"] = e.normalize_topk;
    j["routed_scaling_factor"] = e.routed_scaling_factor;
    j["n_group"] = e.n_group;
    j["topk_group"] = e.topk_group;
    j.erase("router_aux_loss_coef");
  }

  // Router and shared expert as DeepSeek-V3's; the routed experts as one fused stack per layer.
  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    const std::string block = hf_layer + "mlp.", mine = our_layer + "moe.";
    out.push_back({block + "gate.weight", mine + "router.weight"});
    const std::string sh = block + "shared_experts.";
    out.push_back({sh + "gate_proj.weight", mine + "shared_expert.w_gate", 0, 0, -1, true});
    out.push_back({sh + "up_proj.weight", mine + "shared_expert.w_up", 0, 0, -1, true});
    out.push_back({sh + "down_proj.weight", mine + "shared_expert.w_down", 0, 0, -1, true});
    fused_expert_tensors(cfg, block + "experts.", our_layer, out);
  }
  bool router_kept_fp32() const override { return false; }
};

// Mistral Small 4 as released: Mistral3ForConditionalGeneration, the text model above under
// language_model.model.* (its keys under text_config), a Pixtral vision tower and projector
// beside it, carried through training and written back as imported.
class Mistral3Release final : public ModelFamily {
 public:
  explicit Mistral3Release(const Mistral4& text) : text_(text) {}
  const char* model_type() const override { return "mistral3"; }
  const char* architecture() const override { return "Mistral3ForConditionalGeneration"; }
  const char* title() const override { return "Mistral Small 4 (vision-language)"; }
  const char* releases() const override {
    return "Mistral-Small-4-119B-2603 as released (vision tower carried)";
  }
  bool has(Feature f) const override { return text_.has(f); }
  json tiny_config() const override {
    json text = text_.tiny_config();
    text.erase("architectures");
    text["model_type"] = "mistral4";
    return json({{"architectures", {architecture()}},
                 {"model_type", model_type()},
                 {"text_config", text},
                 {"vision_config", {{"model_type", "pixtral"}, {"hidden_size", 32}}},
                 {"tie_word_embeddings", false}});
  }
  double default_partial_rotary_factor() const override {
    return text_.default_partial_rotary_factor();
  }
  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    text_.read_config(k, m, e, warnings);
  }
  int claim(const config::Config&) const override { return 0; }  // written for its imports only
  void check_export(const config::Config& cfg) const override { text_.check_export(cfg); }
  bool writes_head_dim() const override { return false; }
  void write_config(const config::Config& cfg, json& j) const override {
    text_.write_config(cfg, j);
  }
  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    text_.moe_tensors(cfg, hf_layer, our_layer, out);
  }
  const char* text_config_key() const override { return "text_config"; }
  const char* text_family() const override { return "mistral4"; }
  const char* hf_model_prefix() const override { return "language_model.model."; }
  const char* hf_head_name() const override { return "language_model.lm_head.weight"; }
  bool carried_tensor(const std::string& hf) const override {
    return hf.rfind("vision_tower.", 0) == 0 || hf.rfind("multi_modal_projector.", 0) == 0;
  }

 private:
  const Mistral4& text_;
};

}  // namespace

void register_mistral4_family(std::vector<const ModelFamily*>& out) {
  static const Mistral4 kMistral4;
  static const Mistral3Release kMistral3Release(kMistral4);
  out.push_back(&kMistral4);
  out.push_back(&kMistral3Release);
}

}  // namespace moe::families
