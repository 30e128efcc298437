// DeepSeek-V2 / V3, Kimi, Moonlight, GLM-4.7-Flash (transformers' DeepseekV2Config /
// DeepseekV3Config / Glm4MoeLiteConfig; their defaults where config.json has no key): multi-head
// latent attention, shared experts, dense first layers. V3: sigmoid scores with
// e_score_correction_bias, groups scored by their two best, normalised and scaled weights. V2:
// softmax scores, topk_method greedy or group_limited_greedy (groups scored by their best),
// scaled and never normalised. GLM-4.7-Flash: V3's attention and router (GLM-4.5's is the same
// arithmetic) with its own defaults, its dense layers named by mlp_layer_types.
#include "moe/families/latent_attention_keys.h"
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

void refuse(const std::string& key, const std::string& why) { throw UserError(key + ": " + why); }

enum class Kind { kV2, kV3, kGlmLite };

class Deepseek : public ModelFamily {
 public:
  explicit Deepseek(Kind kind) : v3_(kind != Kind::kV2), lite_(kind == Kind::kGlmLite) {}

  const char* model_type() const override {
    return lite_ ? "glm4_moe_lite" : v3_ ? "deepseek_v3" : "deepseek_v2";
  }
  const char* architecture() const override {
    return lite_ ? "Glm4MoeLiteForCausalLM"
           : v3_ ? "DeepseekV3ForCausalLM"
                 : "DeepseekV2ForCausalLM";
  }
  const char* title() const override {
    return lite_ ? "GLM-4.7-Flash" : v3_ ? "DeepSeek-V3" : "DeepSeek-V2";
  }
  const char* releases() const override {
    return lite_ ? "GLM-4.7-Flash"
           : v3_ ? "DeepSeek-V3 / V3.1 / R1, Kimi-K2 (FP8; INT4: K2-Thinking, K2.5), Moonlight"
                 : "DeepSeek-V2, V2-Lite, V2.5";
  }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kLatentAttention:
      case Feature::kRopeInterleave:
      case Feature::kSharedExperts:
      case Feature::kExpertGroups:
      case Feature::kRoutedScaling:
      case Feature::kDenseLayers:
        return true;
      case Feature::kSigmoidScores:
      case Feature::kSelectionBias:
        return v3_;
      case Feature::kGroupScoreBest1:
        return !v3_;
      default:
        return false;
    }
  }

  // Latent attention needs num_key_value_heads = num_attention_heads.
  nlohmann::json tiny_config() const override {
    nlohmann::json c = tiny_common_keys();
    c.update(nlohmann::json({{"architectures", {architecture()}},
                             {"kv_lora_rank", 16},
                             {"qk_rope_head_dim", 8},
                             {"qk_nope_head_dim", 16},
                             {"v_head_dim", 12},
                             {"moe_intermediate_size", 32},
                             {"intermediate_size", 80},
                             {"n_routed_experts", 4},
                             {"first_k_dense_replace", 1},
                             {"num_key_value_heads", 4}}));
    if (lite_) {
      c.erase("first_k_dense_replace");
      c.update(nlohmann::json({{"q_lora_rank", 24},
                               {"n_shared_experts", 1},
                               {"mlp_layer_types", {"dense", "sparse", "sparse"}},
                               {"routed_scaling_factor", 1.8}}));
    } else if (v3_) {
      c.update(nlohmann::json({{"q_lora_rank", 24},
                               {"n_shared_experts", 1},
                               {"n_group", 2},
                               {"topk_group", 1},
                               {"routed_scaling_factor", 2.5}}));
    } else {
      c.update(nlohmann::json({{"q_lora_rank", nullptr},
                               {"n_shared_experts", 2},
                               {"topk_method", "greedy"},
                               {"routed_scaling_factor", 1.0}}));
    }
    return c;
  }

  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    read_latent_attention(k, m);
    m["dense_hidden_size"] = k.integer("intermediate_size", lite_ ? 10240 : 0);
    e["num_experts"] = k.integer("n_routed_experts", v3_ && !lite_ ? 256 : 64);
    const int64_t f = k.integer("moe_intermediate_size", lite_ ? 1536 : 0);
    e["expert_hidden_size"] = f;
    e["mlp_only_layers"] = lite_ ? dense_layer_types(k) : first_k_dense_layers(k, v3_ ? 3 : 0);
    e["shared_expert_hidden_size"] = k.integer("n_shared_experts", v3_ ? 1 : 2) * f;
    e["routed_scaling_factor"] = k.number("routed_scaling_factor", lite_ ? 1.8 : v3_ ? 2.5 : 1.0);
    e["aux_loss_coeff"] = 0.0;  // transformers' DeepSeek classes train without one
    if (v3_) {
      e["score_function"] = "sigmoid";
      e["normalize_topk"] = k.boolean("norm_topk_prob", true);
      e["n_group"] = k.integer("n_group", lite_ ? 1 : 8);
      e["topk_group"] = k.integer("topk_group", lite_ ? 1 : 4);
      e["group_score_experts"] = 2;
      return;
    }
    read_v2_routing(k, e, warnings);
  }

  // GLM-4.7-Flash claims nothing: its checkpoints are DeepSeek-V3's; export-hf writes it for a
  // checkpoint imported from it, or when --architecture names it.
  int claim(const config::Config& cfg) const override {
    const bool sigmoid = cfg.moe.score_function == config::ScoreFunction::kSigmoid;
    return !lite_ && config::latent_attention(cfg) && sigmoid == v3_ ? 100 : 0;
  }
  // Latent attention, the family's router, shared experts as whole multiples of the routed
  // width, dense layers first.
  void check_export(const config::Config& cfg) const override {
    const auto& e = cfg.moe;
    const std::string name = title();
    if (!config::latent_attention(cfg)) {
      refuse("model.kv_lora_rank", name + " has multi-head latent attention (kv_lora_rank > 0)");
    }
    if (v3_) {
      if (e.score_function != config::ScoreFunction::kSigmoid) {
        refuse("moe.score_function", "DeepSeek-V3 routes with sigmoid scores");
      }
    } else {
      check_v2_router(cfg);
    }
    if (e.n_group > 1 && e.group_score_experts != (v3_ ? 2 : 1)) {
      refuse("moe.group_score_experts", name + " scores a group by its " +
                                            std::string(v3_ ? "two best experts (2)" : "best (1)"));
    }
    const int64_t f_width = config::expert_hidden_size(cfg);
    if (e.shared_expert_hidden_size % f_width != 0) {
      refuse("moe.shared_expert_hidden_size",
             name + "'s shared experts are n_shared_experts x moe_intermediate_size (" +
                 std::to_string(f_width) + ")");
    }
    if (!lite_) require_dense_layers_first(cfg, name);  // mlp_layer_types names any layer
  }
  bool writes_head_dim() const override { return false; }
  void write_config(const config::Config& cfg, json& j) const override;

  bool router_kept_fp32() const override { return true; }
  bool has_mtp_layers() const override { return true; }

 private:
  void read_latent_attention(const HfKeys& k, json& m) const {
    LatentDefaults d;
    if (lite_) d.q_lora_rank = 768, d.qk_nope_head_dim = 192, d.v_head_dim = 256;
    d.reads_rope_interleave = v3_;  // V2: the complex form, always interleaved
    families::read_latent_attention(k, m, d);
  }

  // Glm4MoeLiteConfig's mlp_layer_types ("dense" / "sparse" per layer; default the first
  // dense) as our moe.mlp_only_layers.
  static json dense_layer_types(const HfKeys& k) {
    const int64_t layers = k.integer("num_hidden_layers");
    json dense = json::array();
    if (!k.present("mlp_layer_types")) return json::array({0});
    const auto types = k.strings("mlp_layer_types", "\"dense\" or \"sparse\" per layer");
    if (static_cast<int64_t>(types.size()) != layers)
      k.fail("mlp_layer_types", "expected one entry per layer (num_hidden_layers)");
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "dense" && types[i] != "sparse")
        k.fail("mlp_layer_types", "expected \"dense\" or \"sparse\", not \"" + types[i] + "\"");
      if (types[i] == "dense") dense.push_back(static_cast<int64_t>(i));
    }
    return dense;
  }

  static void read_v2_routing(const HfKeys& k, json& e, std::vector<std::string>* warnings) {
    e["score_function"] = "softmax";
    e["normalize_topk"] = false;
    if (k.boolean("norm_topk_prob", false) && warnings != nullptr) {
      warnings->push_back(
          "norm_topk_prob = true is not applied: transformers' DeepseekV2 router never "
          "renormalises (neither does moe-train for this family)");
    }
    const std::string method = k.string("topk_method", "greedy");
    if (method == "greedy") return;
    if (method != "group_limited_greedy") {
      k.fail("topk_method", "expected greedy or group_limited_greedy (transformers' DeepseekV2)");
    }
    e["n_group"] = k.integer("n_group");
    e["topk_group"] = k.integer("topk_group");
    e["group_score_experts"] = 1;
  }

  static void check_v2_router(const config::Config& cfg) {
    const auto& e = cfg.moe;
    if (e.score_function != config::ScoreFunction::kSoftmax) {
      refuse("moe.score_function", "DeepSeek-V2 routes with softmax scores");
    }
    if (e.normalize_topk && e.top_k > 1) {
      refuse("moe.normalize_topk", "DeepSeek-V2's router never renormalises the top-k weights");
    }
    if (e.router_bias_update_rate > 0) {
      refuse("moe.router_bias_update_rate", "DeepSeek-V2 has no selection bias");
    }
    if (!cfg.model.rope_interleave) {
      refuse("model.rope_interleave", "DeepSeek-V2 rotates interleaved pairs (always true)");
    }
  }

  bool v3_, lite_;  // lite_: GLM-4.7-Flash (v3_ too: V3's router and attention)
};

// DeepseekV2Config / DeepseekV3Config's keys.
void Deepseek::write_config(const config::Config& cfg, json& j) const {
  const auto& m = cfg.model;
  const auto& e = cfg.moe;
  const int64_t width = config::expert_hidden_size(cfg);
  j["n_routed_experts"] = e.num_experts;
  j["moe_intermediate_size"] = width;
  j["intermediate_size"] = config::dense_hidden_size(cfg);
  if (lite_) {
    json types = json::array();
    for (int64_t l = 0; l < m.num_layers; ++l)
      types.push_back(config::is_moe_layer(cfg, l) ? "sparse" : "dense");
    j["mlp_layer_types"] = types;
  } else {
    j["first_k_dense_replace"] = leading_dense_layers(cfg);
  }
  j["n_shared_experts"] = e.shared_expert_hidden_size / width;
  j["routed_scaling_factor"] = e.routed_scaling_factor;
  j["n_group"] = e.n_group;
  j["topk_group"] = e.topk_group;
  write_latent_attention(m, j);
  j.erase("router_aux_loss_coef");
  if (v3_) {
    j["norm_topk_prob"] = e.normalize_topk;
    j["rope_interleave"] = m.rope_interleave;
    // the MTP layers are not imported (docs/hf.md); Glm4MoeLiteConfig has no such key
    if (!lite_) j["num_nextn_predict_layers"] = 0;
  } else {
    j["norm_topk_prob"] = false;
    j["topk_method"] = e.n_group > 1 ? "group_limited_greedy" : "greedy";
  }
}

}  // namespace

void register_deepseek_family(std::vector<const ModelFamily*>& out) {
  static const Deepseek kV2(Kind::kV2), kV3(Kind::kV3), kGlmLite(Kind::kGlmLite);
  out.push_back(&kV2);
  out.push_back(&kV3);
  out.push_back(&kGlmLite);
}

}  // namespace moe::families
