// GLM-4.5 / 4.6 / 4.5-Air (transformers' Glm4MoeConfig): DeepSeek-V3's routing (sigmoid scores,
// e_score_correction_bias, groups, scaled weights, shared experts, dense first layers) over GQA
// attention with q/k/v biases, optional per-head q/k norms and partial rotary.
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

class Glm4Moe final : public ModelFamily {
 public:
  const char* model_type() const override { return "glm4_moe"; }
  const char* architecture() const override { return "Glm4MoeForCausalLM"; }
  const char* title() const override { return "GLM-4.5"; }
  const char* releases() const override { return "GLM-4.5, GLM-4.6, GLM-4.5-Air"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kSharedExperts:
      case Feature::kSigmoidScores:
      case Feature::kSelectionBias:
      case Feature::kExpertGroups:
      case Feature::kRoutedScaling:
      case Feature::kQkvBias:
      case Feature::kPartialRotary:
      case Feature::kQkNorm:
      case Feature::kDenseLayers:
        return true;
      default:
        return false;
    }
  }

  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {"Glm4MoeForCausalLM"}},
                             {"head_dim", 16},
                             {"partial_rotary_factor", 0.5},
                             {"attention_bias", true},
                             {"use_qk_norm", true},
                             {"intermediate_size", 80},
                             {"moe_intermediate_size", 32},
                             {"n_routed_experts", 4},
                             {"n_shared_experts", 1},
                             {"first_k_dense_replace", 1},
                             {"n_group", 2},
                             {"topk_group", 1},
                             {"routed_scaling_factor", 2.5},
                             {"norm_topk_prob", true}}));
    return c;
  }

  // Glm4MoeConfig sets partial_rotary_factor 0.5 where config.json has none.
  double default_partial_rotary_factor() const override { return 0.5; }
  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    e["num_experts"] = k.present("n_routed_experts") ? k.integer("n_routed_experts")
                                                     : k.integer("num_local_experts");
    const int64_t f = k.integer("moe_intermediate_size");
    e["expert_hidden_size"] = f;
    m["dense_hidden_size"] = k.integer("intermediate_size");
    e["mlp_only_layers"] = first_k_dense_layers(k, 1);
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
    // The MTP layers' tensors are counted where they are skipped (load_hf_weights).
  }

  int claim(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    const bool glm = e.score_function == config::ScoreFunction::kSigmoid ||
                     e.shared_expert_hidden_size > 0 || m.qkv_bias ||
                     m.partial_rotary_factor != 1.0;
    return glm ? 80 : 0;
  }
  // The layer rule first_k_dense_replace can say, shared experts as whole multiples of the
  // routed width, sigmoid scores.
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    if (e.score_function != config::ScoreFunction::kSigmoid) {
      throw UserError("moe.score_function: GLM-4.5 routes with sigmoid scores");
    }
    if (m.qk_norm && m.qk_norm_scope != config::QkNormScope::kHead) {
      throw UserError("model.qk_norm_scope: GLM-4.5's q/k norms are per head");
    }
    const int64_t f = config::expert_hidden_size(cfg);
    if (e.shared_expert_hidden_size == 0 || e.shared_expert_hidden_size % f != 0) {
      throw UserError(
          "moe.shared_expert_hidden_size: a sigmoid-routed model is exported as GLM-4.5, whose "
          "shared experts are n_shared_experts >= 1 x moe_intermediate_size (" +
          std::to_string(f) + ")");
    }
    require_dense_layers_first(cfg, "GLM-4.5");
  }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    j["n_routed_experts"] = e.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["first_k_dense_replace"] = leading_dense_layers(cfg);
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
  }

  bool router_kept_fp32() const override { return true; }
  bool has_mtp_layers() const override { return true; }
};

}  // namespace

void register_glm4_moe_family(std::vector<const ModelFamily*>& out) {
  static const Glm4Moe kGlm4Moe;
  out.push_back(&kGlm4Moe);
}

}  // namespace moe::families
