// OLMoE (transformers' OlmoeConfig): q/k norms over the whole projections, clip_qkv, every
// layer MoE, norm_topk_prob false by default.
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

class Olmoe final : public ModelFamily {
 public:
  const char* model_type() const override { return "olmoe"; }
  const char* architecture() const override { return "OlmoeForCausalLM"; }
  const char* title() const override { return "OLMoE"; }
  const char* releases() const override { return "OLMoE-1B-7B"; }
  bool has(Feature f) const override { return f == Feature::kQkNorm || f == Feature::kClipQkv; }

  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {"OlmoeForCausalLM"}},
                             {"num_experts", 4},
                             {"intermediate_size", 48},
                             {"clip_qkv", 8.0}}));
    return c;
  }

  void read_config(const HfKeys& k, nlohmann::json& m, nlohmann::json& e,
                   std::vector<std::string>*) const override {
    e["num_experts"] = k.integer("num_experts");
    e["expert_hidden_size"] = k.integer("intermediate_size");
    e["normalize_topk"] = k.boolean("norm_topk_prob", false);
    m["qk_norm"] = true;
    m["qk_norm_scope"] = "full";
    m["clip_qkv"] = k.number("clip_qkv", 0.0);
    const int64_t hidden = m["hidden_size"].get<int64_t>(), heads = m["num_heads"].get<int64_t>();
    if (m["head_dim"].get<int64_t>() * heads != hidden) {
      k.fail("head_dim", "OLMoE's q/k norms need num_attention_heads x head_dim = hidden_size");
    }
  }

  int claim(const config::Config& cfg) const override {
    return cfg.model.qk_norm && cfg.model.qk_norm_scope == config::QkNormScope::kFull ? 40 : 0;
  }
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    if (!m.qk_norm || m.qk_norm_scope != config::QkNormScope::kFull) {
      throw UserError("model.qk_norm: OLMoE has full-width q/k norms (qk_norm_scope full)");
    }
    if (config::head_dim(cfg) * m.num_heads != m.hidden_size) {
      throw UserError("model.head_dim: OLMoE needs num_heads x head_dim = hidden_size");
    }
  }
  bool writes_head_dim() const override { return false; }
  void write_config(const config::Config& cfg, nlohmann::json& j) const override {
    j["num_experts"] = cfg.moe.num_experts;
    j["intermediate_size"] = config::expert_hidden_size(cfg);
    j["norm_topk_prob"] = cfg.moe.normalize_topk;
    j["attention_bias"] = false;
    j["clip_qkv"] = cfg.model.clip_qkv > 0 ? nlohmann::json(cfg.model.clip_qkv) : nullptr;
  }
};

}  // namespace

void register_olmoe_family(std::vector<const ModelFamily*>& out) {
  static const Olmoe kOlmoe;
  out.push_back(&kOlmoe);
}

}  // namespace moe::families
