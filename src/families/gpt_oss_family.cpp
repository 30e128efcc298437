// gpt-oss (transformers' GptOssConfig): q/k/v/o biases, a learned sink per head, alternating
// sliding-window / full layers, a biased router whose top-k logits are softmaxed (= softmax
// scores renormalised over the k), clamped SwiGLU experts stacked [E, ...] with gate and up
// interleaved in one tensor.
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

void refuse(const std::string& key, const std::string& why) { throw UserError(key + ": " + why); }

// layer_types, or GptOssConfig's default where config.json has none: even layers slide.
std::vector<std::string> layer_types(const HfKeys& k, int64_t layers, int64_t window) {
  std::vector<std::string> types = k.strings("layer_types", "full_attention / sliding_attention");
  if (types.empty()) {
    for (int64_t i = 0; i < layers; ++i) {
      types.push_back((i + 1) % 2 ? "sliding_attention" : "full_attention");
    }
  }
  if (static_cast<int64_t>(types.size()) != layers) {
    k.fail("layer_types",
           "needs one entry per layer (num_hidden_layers = " + std::to_string(layers) + ")");
  }
  for (const auto& t : types) {
    if (t != "full_attention" && t != "sliding_attention") {
      k.fail("layer_types", "expected full_attention or sliding_attention, got " + t);
    }
    if (t == "sliding_attention" && window <= 0) {
      k.fail("sliding_window", "sliding_attention layers need a window > 0");
    }
  }
  return types;
}

class GptOss final : public ModelFamily {
 public:
  const char* model_type() const override { return "gpt_oss"; }
  const char* architecture() const override { return "GptOssForCausalLM"; }
  const char* title() const override { return "gpt-oss"; }
  const char* releases() const override { return "gpt-oss-20b, gpt-oss-120b (bf16 or MXFP4)"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kAttentionBias:
      case Feature::kAttentionSinks:
      case Feature::kSlidingWindow:
      case Feature::kRouterBias:
      case Feature::kSoftmaxAfterTopk:
      case Feature::kExpertBias:
      case Feature::kClampedSwiglu:
        return true;
      default:
        return false;
    }
  }

  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {"GptOssForCausalLM"}},
                             {"num_local_experts", 4},
                             {"intermediate_size", 48},
                             {"head_dim", 16},
                             {"sliding_window", 16}}));
    return c;
  }

  double default_rope_theta() const override { return 150000.0; }
  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    const int64_t layers = k.integer("num_hidden_layers");
    m["attention_bias"] = k.boolean("attention_bias", true);
    m["attention_sinks"] = true;
    m["qk_norm"] = false;
    const int64_t window = k.integer("sliding_window", 0);
    m["sliding_window"] = window;
    m["layer_types"] = layer_types(k, layers, window);
    e["num_experts"] = k.integer("num_local_experts");
    e["expert_hidden_size"] = k.integer("intermediate_size");
    e["normalize_topk"] = true;
    e["softmax_after_topk"] = true;
    e["router_bias"] = true;
    e["expert_bias"] = true;
    e["activation"] = "clamped_swiglu";
    e["swiglu_limit"] = k.number("swiglu_limit", 7.0);
    e["swiglu_alpha"] = k.number("swiglu_alpha", 1.702);
  }

  int claim(const config::Config& cfg) const override { return cfg.model.attention_sinks ? 60 : 0; }
  void check_export(const config::Config& cfg) const override {
    const auto& m = cfg.model;
    const auto& e = cfg.moe;
    if (!m.attention_bias) refuse("model.attention_bias", "gpt-oss has q/k/v/o biases");
    if (!m.attention_sinks) refuse("model.attention_sinks", "gpt-oss has attention sinks");
    if (!e.softmax_after_topk) {
      refuse("moe.softmax_after_topk", "gpt-oss softmaxes the top-k logits");
    }
    if (!e.router_bias) refuse("moe.router_bias", "gpt-oss's router has a bias");
    if (!e.expert_bias) refuse("moe.expert_bias", "gpt-oss's experts have biases");
    if (e.activation != config::ExpertActivation::kClampedSwiglu) {
      refuse("moe.activation", "gpt-oss's experts use clamped_swiglu");
    }
  }
  void write_config(const config::Config& cfg, json& j) const override {
    j["num_local_experts"] = cfg.moe.num_experts;
    j["intermediate_size"] = config::expert_hidden_size(cfg);
    j["attention_bias"] = true;
    j["sliding_window"] = cfg.model.sliding_window > 0 ? json(cfg.model.sliding_window) : nullptr;
    json types = json::array();
    for (int64_t i = 0; i < cfg.model.num_layers; ++i) {
      types.push_back(config::attention_window(cfg, i) > 0 ? "sliding_attention"
                                                           : "full_attention");
    }
    j["layer_types"] = types;
    j["swiglu_limit"] = cfg.moe.swiglu_limit;
    j["swiglu_alpha"] = cfg.moe.swiglu_alpha;
  }

  // Whole [E, ...] stacks, gate and up interleaved in one tensor, biases everywhere.
  void moe_tensors(const config::Config&, const std::string& hf, const std::string& ours,
                   std::vector<TensorPiece>& p) const override {
    const std::string ex = hf + "mlp.experts.", mine = ours + "moe.experts.";
    p.push_back({hf + "mlp.router.weight", ours + "moe.router.weight"});
    p.push_back({hf + "mlp.router.bias", ours + "moe.router.bias"});
    p.push_back({ex + "gate_up_proj", mine + "w_gate", -1, 0, -1, false, 0, 2});
    p.push_back({ex + "gate_up_proj", mine + "w_up", -1, 0, -1, false, 1, 2});
    p.push_back({ex + "gate_up_proj_bias", mine + "b_gate", -1, 0, -1, false, 0, 2});
    p.push_back({ex + "gate_up_proj_bias", mine + "b_up", -1, 0, -1, false, 1, 2});
    p.push_back({ex + "down_proj", mine + "w_down"});
    p.push_back({ex + "down_proj_bias", mine + "b_down"});
  }
  bool interleaved_gate_up() const override { return true; }
};

}  // namespace

void register_gpt_oss_family(std::vector<const ModelFamily*>& out) {
  static const GptOss kGptOss;
  out.push_back(&kGptOss);
}

}  // namespace moe::families
