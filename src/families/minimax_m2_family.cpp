// MiniMax-M2 / M2.1 (transformers' MiniMaxM2Config): GQA whose q/k norms run over the whole
// projected q and k (OLMoE's scope, any num_heads x head_dim), partial rotary (the releases'
// legacy `rotary_dim`), every layer MoE with sigmoid scores, an e_score_correction_bias on the
// selection only, top-k renormalised; the experts per expert as w1 (gate), w3 (up), w2 (down)
// under block_sparse_moe, the correction bias beside the router (not under it).
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

class MiniMaxM2 final : public ModelFamily {
 public:
  const char* model_type() const override { return "minimax_m2"; }
  const char* architecture() const override { return "MiniMaxM2ForCausalLM"; }
  const char* title() const override { return "MiniMax-M2"; }
  const char* releases() const override { return "MiniMax-M2, MiniMax-M2.1"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kQkNorm:
      case Feature::kPartialRotary:
      case Feature::kSigmoidScores:
      case Feature::kSelectionBias:
        return true;
      default:
        return false;
    }
  }

  json tiny_config() const override {
    json c = tiny_common_keys();
    c.update(json({{"architectures", {"MiniMaxM2ForCausalLM"}},
                   {"head_dim", 16},
                   {"num_local_experts", 4},
                   {"intermediate_size", 48},
                   {"rope_parameters", {{"rope_theta", 5e6}, {"partial_rotary_factor", 0.5}}}}));
    return c;
  }

  double default_rope_theta() const override { return 5e6; }
  double default_partial_rotary_factor() const override { return 1.0; }
  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    e["num_experts"] = k.integer("num_local_experts");
    e["expert_hidden_size"] = k.integer("intermediate_size");
    e["score_function"] = "sigmoid";
    e["normalize_topk"] = true;
    e["aux_loss_coeff"] = 0.0;  // balanced by the correction bias (moe.router_bias_update_rate)
    m["qk_norm"] = true;
    m["qk_norm_scope"] = "full";
    // The releases name the rotary width (rotary_dim) where transformers derives the factor.
    if (k.present("rotary_dim") && !partial_rotary_given(k)) {
      const double head_dim = m["head_dim"].get<double>();
      m["partial_rotary_factor"] = static_cast<double>(k.integer("rotary_dim")) / head_dim;
    }
    if (k.number("router_jitter_noise", 0.0) != 0.0 && warnings != nullptr) {
      warnings->push_back("router_jitter_noise is not imported (moe-train routes without it)");
    }
  }

  // Sigmoid scores with q/k norms over the whole projections: what MiniMax-M2 alone has.
  int claim(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    return cfg.moe.score_function == config::ScoreFunction::kSigmoid && m.qk_norm &&
                   m.qk_norm_scope == config::QkNormScope::kFull &&
                   cfg.moe.shared_expert_hidden_size == 0
               ? 90
               : 0;
  }
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    if (!m.qk_norm || m.qk_norm_scope != config::QkNormScope::kFull) {
      throw UserError(
          "model.qk_norm: MiniMax-M2 has q/k norms over the whole projections "
          "(qk_norm_scope full)");
    }
    if (cfg.moe.score_function != config::ScoreFunction::kSigmoid || !cfg.moe.normalize_topk) {
      throw UserError("moe.score_function: MiniMax-M2 routes with sigmoid scores, renormalised");
    }
    if (cfg.moe.n_group > 1 || cfg.moe.routed_scaling_factor != 1.0) {
      throw UserError("moe.n_group: MiniMax-M2 routes without expert groups or scaling");
    }
  }
  void write_config(const config::Config& cfg, json& j) const override {
    j["num_local_experts"] = cfg.moe.num_experts;
    j["intermediate_size"] = config::expert_hidden_size(cfg);
    j["rope_parameters"]["partial_rotary_factor"] = cfg.model.partial_rotary_factor;
    j["router_jitter_noise"] = 0.0;
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    const size_t first = out.size();
    split_expert_tensors(cfg, hf_layer, our_layer, {"block_sparse_moe.", "w1", "w3", "w2"}, out);
    // Its correction bias sits beside the router: block_sparse_moe.e_score_correction_bias.
    const std::string under_gate = hf_layer + "block_sparse_moe.gate.e_score_correction_bias";
    for (size_t i = first; i < out.size(); ++i) {
      if (out[i].hf == under_gate)
        out[i].hf = hf_layer + "block_sparse_moe.e_score_correction_bias";
    }
  }

 private:
  static bool partial_rotary_given(const HfKeys& k) {
    if (k.present("partial_rotary_factor")) return true;
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      if (k.present(key) && k.raw(key).is_object() && k.raw(key).contains("partial_rotary_factor"))
        return true;
    }
    return false;
  }
};

}  // namespace

void register_minimax_m2_family(std::vector<const ModelFamily*>& out) {
  static const MiniMaxM2 kMiniMaxM2;
  out.push_back(&kMiniMaxM2);
}

}  // namespace moe::families
