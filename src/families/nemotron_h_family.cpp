// NVIDIA Nemotron-H / Nemotron 3 (transformers' NemotronHConfig): one sublayer per block, as
// layers_block_type (or the older hybrid_override_pattern "M*E-") lists them: Mamba-2 mixers,
// attention without any position encoding, MoE layers (sigmoid scores with a correction bias,
// group-limited choice, a shared expert, non-gated relu^2 experts with up and down only) and
// dense relu^2 MLPs; each behind one RMSNorm ("norm") and held as "mixer.", under "backbone.".
#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

// transformers' names of a block's kind (layers_block_type, and the pattern's letters) and ours.
struct BlockKind {
  const char* hf;
  char letter;
  const char* ours;
};
constexpr BlockKind kKinds[] = {{"linear_attention", 'M', "mamba"},
                                {"full_attention", '*', "full_attention"},
                                {"moe", 'E', "moe"},
                                {"mlp", '-', "mlp"}};

std::string ours_of(const HfKeys& k, const std::string& key, const std::string& hf) {
  // Older configs name Mamba layers "mamba" and attention "attention" (transformers remaps them).
  const std::string name = hf == "mamba"       ? "linear_attention"
                           : hf == "attention" ? "full_attention"
                                               : hf;
  for (const auto& kind : kKinds) {
    if (name == kind.hf) return kind.ours;
  }
  k.fail(key, "expected linear_attention, full_attention, moe or mlp, got " + hf);
}

std::vector<std::string> block_kinds(const HfKeys& k) {
  std::vector<std::string> out;
  if (k.present("layers_block_type")) {
    for (const auto& t : k.strings("layers_block_type", "block types")) {
      out.push_back(ours_of(k, "layers_block_type", t));
    }
  } else if (k.present("hybrid_override_pattern")) {
    const json& p = k.raw("hybrid_override_pattern");
    if (!p.is_string()) k.fail("hybrid_override_pattern", "expected a string of M, *, E and -");
    for (char c : p.get<std::string>()) {
      const BlockKind* found = nullptr;
      for (const auto& kind : kKinds) found = kind.letter == c ? &kind : found;
      if (found == nullptr) {
        k.fail("hybrid_override_pattern", std::string("expected M, *, E or -, got '") + c + "'");
      }
      out.push_back(found->ours);
    }
  } else {
    k.fail("layers_block_type", "missing (and no hybrid_override_pattern)");
  }
  if (out.empty()) k.fail("layers_block_type", "lists no layers");
  return out;
}

class NemotronH final : public ModelFamily {
 public:
  const char* model_type() const override { return "nemotron_h"; }
  const char* architecture() const override { return "NemotronHForCausalLM"; }
  const char* title() const override { return "Nemotron-H / Nemotron 3"; }
  const char* releases() const override {
    return "Nemotron-3-Nano-30B-A3B, Nemotron-3-Super-120B-A12B (bf16 weights; LatentMoE; "
           "Super's MTP layers are not trained)";
  }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kMamba:
      case Feature::kSublayerBlocks:
      case Feature::kNoPositions:
      case Feature::kRelu2:
      case Feature::kLatentExperts:
      case Feature::kDenseLayers:
      case Feature::kSharedExperts:
      case Feature::kSigmoidScores:
      case Feature::kSelectionBias:
      case Feature::kExpertGroups:
      case Feature::kRoutedScaling:
        return true;
      default:
        return false;
    }
  }
  const char* hf_model_prefix() const override { return "backbone."; }
  const char* peft_model_prefix() const override { return "model."; }
  const char* attention_module() const override { return "mixer."; }
  const char* mamba_module() const override { return "mixer."; }
  const char* dense_mlp_module() const override { return "mixer."; }
  const char* input_norm() const override { return "norm"; }
  const char* experts_module() const override { return "mixer.experts."; }
  const char* embedding_tensor() const override { return "embeddings.weight"; }
  const char* final_norm_tensor() const override { return "norm_f.weight"; }
  bool router_kept_fp32() const override { return true; }
  bool has_mtp_layers() const override { return true; }

  // Mamba, MoE, attention, MLP, Mamba, MoE: every kind, a Mamba layer after attention.
  json tiny_config() const override {
    json c = tiny_common_keys();
    c.erase("num_hidden_layers");
    c.update(
        json({{"architectures", {architecture()}},
              {"model_type", model_type()},
              {"layers_block_type",
               {"linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"}},
              {"head_dim", 16},
              {"intermediate_size", 96},
              {"mamba_num_heads", 4},
              {"mamba_head_dim", 16},
              {"ssm_state_size", 8},
              {"n_groups", 2},
              {"chunk_size", 8},
              {"n_routed_experts", 4},
              {"moe_intermediate_size", 32},
              {"moe_shared_expert_intermediate_size", 48},
              {"layer_norm_epsilon", 1e-5}}));
    return c;
  }

  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    const auto kinds = block_kinds(k);
    m["layer_types"] = kinds;
    m["num_layers"] = static_cast<int64_t>(kinds.size());
    m["sublayer_blocks"] = true;
    m["no_position_encoding"] = true;  // Nemotron-H's attention has no rotary
    m["rope_theta"] = 0.0;
    m["partial_rotary_factor"] = 1.0;
    m.erase("rope_scaling");
    m["norm_eps"] = k.number("layer_norm_epsilon", 1e-5);
    m["dense_hidden_size"] = k.integer("intermediate_size", 21504);
    if (k.string("mlp_hidden_act", "relu2") != "relu2") {
      k.fail("mlp_hidden_act", "only relu2 is supported");
    }
    if (k.string("mamba_hidden_act", "silu") != "silu") {
      k.fail("mamba_hidden_act", "only silu is supported");
    }
    if (k.boolean("mlp_bias", false)) k.fail("mlp_bias", "MLP biases are not supported");
    // LatentMoE (Nemotron 3 Super): the routed experts at this width, between fc1_latent_proj and
    // fc2_latent_proj; null on Nano.
    if (k.present("moe_latent_size")) {
      const int64_t latent = k.integer("moe_latent_size");
      if (latent <= 0) k.fail("moe_latent_size", "expected a positive width or null");
      e["latent_size"] = latent;
    }
    m["mamba_num_heads"] = k.integer("mamba_num_heads", 128);
    m["mamba_head_dim"] = k.integer("mamba_head_dim", 64);
    m["ssm_state_size"] = k.integer("ssm_state_size", 128);
    m["mamba_n_groups"] = k.integer("n_groups", k.integer("mamba_n_groups", 8));
    m["mamba_conv_kernel"] = k.integer("conv_kernel", k.integer("mamba_d_conv", 4));
    m["mamba_chunk_size"] = k.integer("chunk_size", k.integer("mamba_chunk_size", 128));
    m["mamba_conv_bias"] = k.boolean("use_conv_bias", true);
    m["mamba_proj_bias"] = k.boolean("use_bias", false);
    read_time_step_limit(k, m);
    e["num_experts"] = k.integer("n_routed_experts", 8);
    e["expert_hidden_size"] = k.integer("moe_intermediate_size", 7688);
    e["shared_expert_hidden_size"] = k.integer("n_shared_experts", 1) > 0
                                         ? k.integer("moe_shared_expert_intermediate_size", 7688)
                                         : 0;
    e["activation"] = "relu2";
    e["score_function"] = "sigmoid";
    e["normalize_topk"] = k.boolean("norm_topk_prob", true);
    e["n_group"] = k.integer("n_group", 1);
    e["topk_group"] = k.integer("topk_group", 1);
    e["group_score_experts"] = 2;
    e["routed_scaling_factor"] = k.number("routed_scaling_factor", 1.0);
    e["aux_loss_coeff"] = 0.0;  // transformers' class trains without one
  }

  int claim(const config::Config& cfg) const override {
    return cfg.model.sublayer_blocks && cfg.model.mamba_num_heads > 0 ? 100 : 0;
  }
  void check_export(const config::Config& cfg) const override {
    if (!cfg.model.sublayer_blocks) {
      throw UserError("model.sublayer_blocks: Nemotron-H holds one sublayer per block (true)");
    }
    if (!cfg.model.no_position_encoding) {
      throw UserError("model.no_position_encoding: Nemotron-H's attention has no positions (true)");
    }
    if (cfg.moe.activation != config::ExpertActivation::kRelu2) {
      throw UserError("moe.activation: Nemotron-H's MLPs and experts are relu2");
    }
    if (cfg.moe.score_function != config::ScoreFunction::kSigmoid) {
      throw UserError("moe.score_function: Nemotron-H routes with sigmoid scores");
    }
  }
  bool writes_head_dim() const override { return true; }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    std::vector<std::string> kinds;
    for (const auto& t : m.layer_types) {
      for (const auto& kind : kKinds) {
        if (t == kind.ours) kinds.push_back(kind.hf);
      }
    }
    j["layers_block_type"] = kinds;
    for (const char* stale : {"num_hidden_layers", "hybrid_override_pattern", "rope_parameters",
                              "rope_theta", "rope_scaling", "hidden_act", "rms_norm_eps"}) {
      j.erase(stale);
    }
    j["layer_norm_epsilon"] = m.norm_eps;
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["mlp_hidden_act"] = "relu2";
    j["mamba_hidden_act"] = "silu";
    j["mamba_num_heads"] = m.mamba_num_heads;
    j["mamba_head_dim"] = m.mamba_head_dim;
    j["ssm_state_size"] = m.ssm_state_size;
    j["n_groups"] = m.mamba_n_groups;
    j["conv_kernel"] = m.mamba_conv_kernel;
    j["chunk_size"] = m.mamba_chunk_size;
    j["use_conv_bias"] = m.mamba_conv_bias;
    j["use_bias"] = m.mamba_proj_bias;
    j["expand"] = 2;  // read by no module (the inner width is heads x head_dim)
    // max 0 (unbounded) is transformers' inf, as its own save_pretrained writes it.
    j["time_step_limit"] = time_step_limit(m);
    const auto& e = cfg.moe;
    j["n_routed_experts"] = e.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["n_shared_experts"] = e.shared_expert_hidden_size > 0 ? 1 : 0;
    j["moe_shared_expert_intermediate_size"] = e.shared_expert_hidden_size;
    j["norm_topk_prob"] = e.normalize_topk;
    j["n_group"] = e.n_group;
    j["topk_group"] = e.topk_group;
    j["routed_scaling_factor"] = e.routed_scaling_factor;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["moe_latent_size"] = e.latent_size > 0 ? json(e.latent_size) : json(nullptr);
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    ExpertNames names;
    names.block = "mixer.";
    split_expert_tensors(cfg, hf_layer, our_layer, names, out);
    if (cfg.moe.latent_size > 0) {
      out.push_back(
          {hf_layer + "mixer.fc1_latent_proj.weight", our_layer + "moe.latent_in.weight"});
      out.push_back(
          {hf_layer + "mixer.fc2_latent_proj.weight", our_layer + "moe.latent_out.weight"});
    }
  }
};

}  // namespace

void register_nemotron_h_family(std::vector<const ModelFamily*>& out) {
  static const NemotronH kNemotronH;
  out.push_back(&kNemotronH);
}

}  // namespace moe::families
