// Qwen3-MoE (transformers' Qwen3MoeConfig): per-head q/k norms, dense layers where
// mlp_only_layers / decoder_sparse_step say, norm_topk_prob.
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

class Qwen3Moe final : public ModelFamily {
 public:
  const char* model_type() const override { return "qwen3_moe"; }
  const char* architecture() const override { return "Qwen3MoeForCausalLM"; }
  const char* title() const override { return "Qwen3-MoE"; }
  const char* releases() const override { return "Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder"; }
  bool has(Feature f) const override { return f == Feature::kQkNorm || f == Feature::kDenseLayers; }

  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {"Qwen3MoeForCausalLM"}},
                             {"num_experts", 4},
                             {"moe_intermediate_size", 32},
                             {"intermediate_size", 80},
                             {"mlp_only_layers", {1}},
                             {"norm_topk_prob", true}}));
    return c;
  }

  void read_config(const HfKeys& k, nlohmann::json& m, nlohmann::json& e,
                   std::vector<std::string>*) const override {
    e["num_experts"] =
        k.present("num_experts") ? k.integer("num_experts") : k.integer("num_local_experts");
    e["expert_hidden_size"] = k.integer("moe_intermediate_size");
    m["dense_hidden_size"] = k.integer("intermediate_size");
    e["decoder_sparse_step"] = k.integer("decoder_sparse_step", 1);
    e["mlp_only_layers"] = k.integers("mlp_only_layers");
    e["normalize_topk"] = k.boolean("norm_topk_prob", false);
    m["qk_norm"] = true;
    m["qk_norm_scope"] = "head";
  }

  int claim(const config::Config& cfg) const override {
    return cfg.model.qk_norm && cfg.model.qk_norm_scope == config::QkNormScope::kHead ? 40 : 0;
  }
  void check_export(const config::Config& cfg) const override {
    if (!cfg.model.qk_norm || cfg.model.qk_norm_scope != config::QkNormScope::kHead) {
      throw UserError("model.qk_norm: Qwen3-MoE has per-head q/k norms (qk_norm_scope head)");
    }
  }
  void write_config(const config::Config& cfg, nlohmann::json& j) const override {
    j["num_experts"] = cfg.moe.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["decoder_sparse_step"] = cfg.moe.decoder_sparse_step;
    j["mlp_only_layers"] = cfg.moe.mlp_only_layers;
    j["norm_topk_prob"] = cfg.moe.normalize_topk;
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
  }
};

}  // namespace

void register_qwen3_moe_family(std::vector<const ModelFamily*>& out) {
  static const Qwen3Moe kQwen3Moe;
  out.push_back(&kQwen3Moe);
}

}  // namespace moe::families
