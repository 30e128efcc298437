// IBM Granite 4.0-H (transformers' GraniteMoeHybridConfig): Mamba-2 and attention layers
// (layer_types "mamba" / "attention", or transformers 5's linear_attention / full_attention), each
// followed by softmax-after-top-k SwiGLU experts beside a shared SwiGLU MLP in every layer;
// attention without positions (position_embedding_type null, the releases) or rotary ("rope");
// Granite's embedding, residual and logits multipliers and its attention_multiplier softmax
// scale. Experts fused on disk as block_sparse_moe.input_linear [E, 2f, d] (gate rows first) and
// output_linear [E, d, f], the router as block_sparse_moe.router.layer.
#include <cmath>

#include "moe/families/layer_rules.h"
#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

std::vector<std::string> layer_kinds(const HfKeys& k, int64_t layers) {
  std::vector<std::string> out;
  const char* key = k.present("layer_types") ? "layer_types" : "layers_block_type";
  for (const auto& t : k.strings(key, "layer types")) {
    if (t == "mamba" || t == "linear_attention") {
      out.push_back("mamba");
    } else if (t == "attention" || t == "full_attention") {
      out.push_back("full_attention");
    } else {
      k.fail(key, "expected mamba or attention (linear_attention, full_attention), got " + t);
    }
  }
  if (out.empty()) out.assign(static_cast<size_t>(layers), "mamba");  // transformers' default
  if (static_cast<int64_t>(out.size()) != layers) {
    k.fail(key, "needs one entry per layer (num_hidden_layers = " + std::to_string(layers) + ")");
  }
  return out;
}

class GraniteMoeHybrid final : public ModelFamily {
 public:
  const char* model_type() const override { return "granitemoehybrid"; }
  const char* architecture() const override { return "GraniteMoeHybridForCausalLM"; }
  const char* title() const override { return "Granite 4.0-H"; }
  const char* releases() const override {
    return "granite-4.0-h-tiny, granite-4.0-h-small (the MoE sizes; the dense Micro is refused)";
  }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kMamba:
      case Feature::kNoPositions:
      case Feature::kMultipliers:
      case Feature::kAttentionScale:
      case Feature::kSoftmaxAfterTopk:
      case Feature::kSharedExperts:
        return true;
      default:
        return false;
    }
  }
  const char* experts_module() const override { return "block_sparse_moe.experts."; }

  // Mamba, attention, Mamba; 4 experts top-2 and a shared MLP; the multipliers away from 1.
  json tiny_config() const override {
    json c = tiny_common_keys();
    c.update(json({{"architectures", {architecture()}},
                   {"model_type", model_type()},
                   {"layer_types", {"mamba", "attention", "mamba"}},
                   {"num_local_experts", 4},
                   {"intermediate_size", 32},
                   {"shared_intermediate_size", 48},
                   {"mamba_n_heads", 4},
                   {"mamba_d_head", 32},
                   {"mamba_d_state", 8},
                   {"mamba_n_groups", 1},
                   {"mamba_chunk_size", 8},
                   {"embedding_multiplier", 12.0},
                   {"residual_multiplier", 0.22},
                   {"logits_scaling", 6.0},
                   {"attention_multiplier", 0.0078125}}));
    return c;
  }

  void read_config(const HfKeys& k, json& m, json& e, std::vector<std::string>*) const override {
    const int64_t layers = m["num_layers"].get<int64_t>(), hidden = k.integer("hidden_size");
    m["layer_types"] = layer_kinds(k, layers);
    const json& pos =
        k.present("position_embedding_type") ? k.raw("position_embedding_type") : json();
    if (!pos.is_null() && !(pos.is_string() && (pos == "rope" || pos == "nope"))) {
      k.fail("position_embedding_type", "expected null, \"nope\" or \"rope\"");
    }
    if (pos != "rope") {  // no positions at all (the releases)
      m["no_position_encoding"] = true;
      m["rope_theta"] = 0.0;
      m["partial_rotary_factor"] = 1.0;
      m.erase("rope_scaling");
    }
    const int64_t heads = k.integer("mamba_n_heads", 128);
    const int64_t inner = static_cast<int64_t>(k.number("mamba_expand", 2.0) * hidden);
    const bool auto_head = k.present("mamba_d_head") && k.raw("mamba_d_head").is_string();
    const int64_t head_dim =
        auto_head || !k.present("mamba_d_head") ? inner / heads : k.integer("mamba_d_head");
    if (heads * head_dim != inner) {
      k.fail("mamba_d_head", "mamba_n_heads x mamba_d_head must be mamba_expand x hidden_size (" +
                                 std::to_string(inner) + ")");
    }
    m["mamba_num_heads"] = heads;
    m["mamba_head_dim"] = head_dim;
    m["ssm_state_size"] = k.integer("mamba_d_state", 256);
    m["mamba_n_groups"] = k.integer("mamba_n_groups", 1);
    m["mamba_conv_kernel"] = k.integer("mamba_d_conv", 4);
    m["mamba_chunk_size"] = k.integer("mamba_chunk_size", 256);
    m["mamba_conv_bias"] = k.boolean("mamba_conv_bias", true);
    m["mamba_proj_bias"] = k.boolean("mamba_proj_bias", false);
    read_time_step_limit(k, m);
    m["embedding_multiplier"] = k.number("embedding_multiplier", 1.0);
    m["residual_multiplier"] = k.number("residual_multiplier", 1.0);
    m["logits_scaling"] = k.number("logits_scaling", 1.0);
    m["attention_scale"] = k.number("attention_multiplier", 1.0);
    if (k.integer("num_local_experts", 8) == 0) {
      k.fail("num_local_experts",
             "0 (a dense Granite 4.0-H) is not supported: moe-train trains "
             "MoE models");
    }
    e["num_experts"] = k.integer("num_local_experts", 8);
    e["expert_hidden_size"] = k.integer("intermediate_size");
    e["shared_expert_hidden_size"] = k.integer("shared_intermediate_size", 1024);
    e["softmax_after_topk"] = true;  // top-k on the logits, softmax over the k
    e["normalize_topk"] = true;
    e["aux_loss_coeff"] = k.number("router_aux_loss_coef", 0.001);
  }

  int claim(const config::Config& cfg) const override {
    return !cfg.model.sublayer_blocks && cfg.model.mamba_num_heads > 0 ? 100 : 0;
  }
  void check_export(const config::Config& cfg) const override {
    if (config::mamba_inner_size(cfg) % cfg.model.hidden_size != 0) {
      throw UserError(
          "model.mamba_head_dim: Granite 4.0-H's Mamba width (heads x head_dim) is an "
          "integer mamba_expand x hidden_size");
    }
    if (cfg.moe.shared_expert_hidden_size == 0) {
      throw UserError(
          "moe.shared_expert_hidden_size: Granite 4.0-H has a shared MLP in every layer");
    }
    if (!cfg.moe.softmax_after_topk) {
      throw UserError("moe.softmax_after_topk: Granite 4.0-H routes top-k on the logits first");
    }
    for (int64_t l = 0; l < cfg.model.num_layers; ++l) {
      if (!config::is_moe_layer(cfg, l)) {
        throw UserError("moe.mlp_only_layers: every Granite 4.0-H layer has experts");
      }
    }
  }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& m = cfg.model;
    std::vector<std::string> kinds;
    for (int64_t l = 0; l < m.num_layers; ++l) {
      kinds.push_back(config::mamba_layer(cfg, l) ? "mamba" : "attention");
    }
    j["layer_types"] = kinds;
    j.erase("layers_block_type");
    if (m.no_position_encoding) {
      j["position_embedding_type"] = nullptr;
      for (const char* stale : {"rope_parameters", "rope_theta", "rope_scaling"}) j.erase(stale);
    } else {
      j["position_embedding_type"] = "rope";
    }
    j["mamba_n_heads"] = m.mamba_num_heads;
    j["mamba_d_head"] = m.mamba_head_dim;
    j["mamba_expand"] = config::mamba_inner_size(cfg) / m.hidden_size;  // an int there
    j["mamba_d_state"] = m.ssm_state_size;
    j["mamba_n_groups"] = m.mamba_n_groups;
    j["mamba_d_conv"] = m.mamba_conv_kernel;
    j["mamba_chunk_size"] = m.mamba_chunk_size;
    j["mamba_conv_bias"] = m.mamba_conv_bias;
    j["mamba_proj_bias"] = m.mamba_proj_bias;
    j["time_step_limit"] = time_step_limit(m);
    j["embedding_multiplier"] = m.embedding_multiplier;
    j["residual_multiplier"] = m.residual_multiplier;
    j["logits_scaling"] = m.logits_scaling;
    j["attention_multiplier"] = m.attention_scale > 0
                                    ? m.attention_scale
                                    : 1.0 / std::sqrt(static_cast<double>(config::head_dim(cfg)));
    j["num_local_experts"] = cfg.moe.num_experts;
    j["intermediate_size"] = config::expert_hidden_size(cfg);
    j["shared_intermediate_size"] = cfg.moe.shared_expert_hidden_size;
    j["router_aux_loss_coef"] = cfg.moe.aux_loss_coeff;
    j["attention_bias"] = false;
  }

  // The router, the fused expert stacks and the fused shared MLP under Granite's names.
  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    const std::string moe = hf_layer + "block_sparse_moe.", mine = our_layer + "moe.";
    out.push_back({moe + "router.layer.weight", mine + "router.weight"});
    const int64_t f = config::expert_hidden_size(cfg);
    TensorPiece gate{moe + "input_linear.weight", mine + "experts.w_gate"};
    gate.transpose = true;  // ours [E, d, f], theirs [E, 2f, d] (gate rows, then up rows)
    gate.hf_rows = f, gate.hf_rows_total = 2 * f;
    TensorPiece up = gate;
    up.ours = mine + "experts.w_up", up.hf_row_begin = f;
    TensorPiece down{moe + "output_linear.weight", mine + "experts.w_down"};
    down.transpose = true;
    out.push_back(gate), out.push_back(up), out.push_back(down);
    // The shared MLP: input_linear [2 fs, d] (gate rows, then up), output_linear [d, fs]; ours a
    // one-expert stack.
    const int64_t fs = cfg.moe.shared_expert_hidden_size;
    TensorPiece sgate{hf_layer + "shared_mlp.input_linear.weight", mine + "shared_expert.w_gate",
                      0};
    sgate.transpose = true;
    sgate.hf_rows = fs, sgate.hf_rows_total = 2 * fs;
    TensorPiece sup = sgate;
    sup.ours = mine + "shared_expert.w_up", sup.hf_row_begin = fs;
    TensorPiece sdown{hf_layer + "shared_mlp.output_linear.weight", mine + "shared_expert.w_down",
                      0};
    sdown.transpose = true;
    out.push_back(sgate), out.push_back(sup), out.push_back(sdown);
  }
};

}  // namespace

void register_granitemoehybrid_family(std::vector<const ModelFamily*>& out) {
  static const GraniteMoeHybrid kGranite;
  out.push_back(&kGranite);
}

}  // namespace moe::families
