// Mixtral (transformers' MixtralConfig): every layer MoE, softmax top-k renormalised, no q/k
// norms; the MoE block is `block_sparse_moe`, the experts' projections w1 (gate), w3 (up), w2
// (down).
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

class Mixtral final : public ModelFamily {
 public:
  const char* model_type() const override { return "mixtral"; }
  const char* architecture() const override { return "MixtralForCausalLM"; }
  const char* title() const override { return "Mixtral"; }
  const char* releases() const override { return "Mixtral 8x7B, 8x22B"; }
  bool has(Feature) const override { return false; }

  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {"MixtralForCausalLM"}},
                             {"num_local_experts", 4},
                             {"intermediate_size", 48}}));
    return c;
  }

  double default_rope_theta() const override { return 1e6; }
  void read_config(const HfKeys& k, nlohmann::json& m, nlohmann::json& e,
                   std::vector<std::string>* warnings) const override {
    if (k.present("sliding_window")) {
      k.fail("sliding_window", "sliding-window attention is not supported (null is)");
    }
    e["num_experts"] = k.integer("num_local_experts");
    e["expert_hidden_size"] = k.integer("intermediate_size");
    e["normalize_topk"] = true;
    m["qk_norm"] = false;
    if (k.number("router_jitter_noise", 0.0) != 0.0 && warnings != nullptr) {
      warnings->push_back("router_jitter_noise is not imported (moe-train routes without it)");
    }
  }

  int claim(const config::Config&) const override { return 1; }  // what nothing else claims
  void check_export(const config::Config& cfg) const override {
    if (!cfg.moe.normalize_topk) throw UserError("moe.normalize_topk: Mixtral always renormalises");
  }
  void write_config(const config::Config& cfg, nlohmann::json& j) const override {
    j["num_local_experts"] = cfg.moe.num_experts;
    j["intermediate_size"] = config::expert_hidden_size(cfg);
    j["sliding_window"] = nullptr;
    j["router_jitter_noise"] = 0.0;
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    split_expert_tensors(cfg, hf_layer, our_layer, {"block_sparse_moe.", "w1", "w3", "w2"}, out);
  }
};

}  // namespace

void register_mixtral_family(std::vector<const ModelFamily*>& out) {
  static const Mixtral kMixtral;
  out.push_back(&kMixtral);
}

}  // namespace moe::families
