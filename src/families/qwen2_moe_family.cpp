// Qwen1.5-MoE / Qwen2-MoE (transformers' Qwen2MoeConfig): q/k/v biases (qkv_bias) without an o
// bias, softmax top-k routing without renormalisation by default (norm_topk_prob), and in every MoE
// layer a SwiGLU shared expert whose output is gated by sigmoid(x . shared_expert_gate); dense
// layers where mlp_only_layers / decoder_sparse_step say. Every layer attends to the whole window
// (use_sliding_window is refused for every family).
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

class Qwen2Moe final : public ModelFamily {
 public:
  const char* model_type() const override { return "qwen2_moe"; }
  const char* architecture() const override { return "Qwen2MoeForCausalLM"; }
  const char* title() const override { return "Qwen2-MoE"; }
  const char* releases() const override { return "Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kQkvBias:
      case Feature::kSharedExperts:
      case Feature::kSharedExpertGate:
      case Feature::kDenseLayers:
        return true;
      default:
        return false;
    }
  }

  // Layer 1 dense (mlp_only_layers), q/k/v biases, a gated shared expert.
  json tiny_config() const override {
    json c = tiny_common_keys();
    c.update(json({{"architectures", {architecture()}},
                   {"num_experts", 4},
                   {"moe_intermediate_size", 32},
                   {"shared_expert_intermediate_size", 48},
                   {"intermediate_size", 80},
                   {"mlp_only_layers", {1}},
                   {"qkv_bias", true}}));
    return c;
  }

  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    m["qkv_bias"] = k.boolean("qkv_bias", true);
    m["dense_hidden_size"] = k.integer("intermediate_size");
    e["num_experts"] = k.integer("num_experts");
    e["expert_hidden_size"] = k.integer("moe_intermediate_size");
    e["shared_expert_hidden_size"] = k.integer("shared_expert_intermediate_size");
    e["shared_expert_gate"] = true;
    e["decoder_sparse_step"] = k.integer("decoder_sparse_step", 1);
    e["mlp_only_layers"] = k.integers("mlp_only_layers");
    e["normalize_topk"] = k.boolean("norm_topk_prob", false);
  }

  // A sigmoid-gated shared expert is Qwen's alone: above GLM-4.5's claim on shared experts and
  // q/k/v biases (80); Qwen3-Next and Qwen3.5 have it with linear attention and q/k norms.
  int claim(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    return cfg.moe.shared_expert_gate && !m.qk_norm && m.linear_num_key_heads == 0 ? 90 : 0;
  }
  void check_export(const config::Config& cfg) const override {
    if (cfg.moe.shared_expert_hidden_size == 0 || !cfg.moe.shared_expert_gate) {
      throw UserError(
          "moe.shared_expert_gate: Qwen2-MoE has a sigmoid-gated shared expert in every MoE "
          "layer (moe.shared_expert_hidden_size > 0, moe.shared_expert_gate true)");
    }
  }
  void write_config(const config::Config& cfg, json& j) const override {
    j.erase("attention_bias");  // Qwen2-MoE's key is qkv_bias (o_proj never has one)
    j["qkv_bias"] = cfg.model.qkv_bias;
    j["num_experts"] = cfg.moe.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["shared_expert_intermediate_size"] = cfg.moe.shared_expert_hidden_size;
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["decoder_sparse_step"] = cfg.moe.decoder_sparse_step;
    j["mlp_only_layers"] = cfg.moe.mlp_only_layers;
    j["norm_topk_prob"] = cfg.moe.normalize_topk;
    j["use_sliding_window"] = false;
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    ExpertNames names;
    names.shared = "shared_expert.";
    split_expert_tensors(cfg, hf_layer, our_layer, names, out);
  }
};

}  // namespace

void register_qwen2_moe_family(std::vector<const ModelFamily*>& out) {
  static const Qwen2Moe kQwen2Moe;
  out.push_back(&kQwen2Moe);
}

}  // namespace moe::families
