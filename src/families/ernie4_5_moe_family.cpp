// ERNIE 4.5 MoE (transformers' Ernie4_5_MoeConfig; ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): GQA
// whose rotary turns interleaved pairs (x0, x1), (x2, x3)..., softmax routing whose selection adds
// a per-expert correction bias (mlp.moe_statics.e_score_correction_bias, [1, E]) that the
// weights do not get, top-k renormalised (clamped at moe_norm_min), shared experts, and MoE
// layers from moe_layer_start_index to moe_layer_end_index every moe_layer_interval (the others
// dense); config keys moe_k / moe_num_experts; embeddings tied unless said otherwise.
#include <algorithm>

#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

using nlohmann::json;

// transformers' rule: layer i is MoE when (i + 1) % interval == 0 and start <= i <= end.
bool ernie_moe_layer(int64_t i, int64_t start, int64_t end, int64_t interval) {
  return (i + 1) % interval == 0 && i >= start && i <= end;
}

class Ernie45Moe final : public ModelFamily {
 public:
  const char* model_type() const override { return "ernie4_5_moe"; }
  const char* architecture() const override { return "Ernie4_5_MoeForCausalLM"; }
  const char* title() const override { return "ERNIE 4.5 MoE"; }
  const char* releases() const override { return "ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B"; }
  bool has(Feature f) const override {
    switch (f) {
      case Feature::kSharedExperts:
      case Feature::kSelectionBias:
      case Feature::kDenseLayers:
      case Feature::kRopeInterleave:
        return true;
      default:
        return false;
    }
  }

  json tiny_config() const override {
    json c = tiny_common_keys();
    c.erase("num_experts_per_tok");
    c.update(json({{"architectures", {"Ernie4_5_MoeForCausalLM"}},
                   {"moe_k", 2},
                   {"moe_num_experts", 4},
                   {"moe_intermediate_size", 32},
                   {"intermediate_size", 80},
                   {"moe_num_shared_experts", 1},
                   {"moe_layer_start_index", 1},
                   {"moe_layer_end_index", -1},
                   {"moe_layer_interval", 1}}));
    return c;
  }

  double default_rope_theta() const override { return 5e5; }
  void read_config(const HfKeys& k, json& m, json& e,
                   std::vector<std::string>* warnings) const override {
    if (k.boolean("use_bias", false)) {
      k.fail("use_bias",
             "biases on the attention and MLP projections are not supported "
             "(the ERNIE 4.5 releases have none)");
    }
    const int64_t experts =
        k.present("moe_num_experts") ? k.integer("moe_num_experts") : k.integer("num_experts");
    const int64_t top_k =
        k.present("moe_k") ? k.integer("moe_k") : k.integer("num_experts_per_tok");
    e["num_experts"] = experts;
    e["top_k"] = top_k;
    const int64_t f = k.integer("moe_intermediate_size", 1536);
    e["expert_hidden_size"] = f;
    m["dense_hidden_size"] = k.integer("intermediate_size", 12288);
    e["shared_expert_hidden_size"] = k.integer("moe_num_shared_experts", 2) * f;
    e["score_function"] = "softmax";
    e["normalize_topk"] = true;
    e["aux_loss_coeff"] = k.number("router_aux_loss_coef", 0.001);
    // Our renormalisation clamps at 1e-20; the top-k of a softmax over E sum to at least k / E,
    // so a moe_norm_min below that never binds on either side.
    const double norm_min = k.number("moe_norm_min", 1e-12);
    if (norm_min >
        static_cast<double>(top_k) / static_cast<double>(std::max<int64_t>(experts, 1))) {
      k.fail("moe_norm_min", "above moe_k / moe_num_experts (it would clamp the renormalisation)");
    }
    m["rope_interleave"] = true;
    m["tie_embeddings"] = k.boolean("tie_word_embeddings", true);
    read_layer_rule(k, m["num_layers"].get<int64_t>(), e);
    if (k.boolean("moe_use_aux_free", false) && warnings != nullptr) {
      warnings->push_back(
          "moe_use_aux_free: the correction bias is imported frozen (set "
          "moe.router_bias_update_rate to update it while training)");
    }
  }

  // Softmax routing over GQA with interleaved rotary: what ERNIE 4.5 alone has.
  int claim(const config::Config& cfg) const override {
    return cfg.model.rope_interleave && !config::latent_attention(cfg) &&
                   cfg.moe.score_function == config::ScoreFunction::kSoftmax
               ? 90
               : 0;
  }
  void check_export(const config::Config& cfg) const override {
    const auto& e = cfg.moe;
    if (e.score_function != config::ScoreFunction::kSoftmax || !e.normalize_topk) {
      throw UserError("moe.score_function: ERNIE 4.5 routes with softmax scores, renormalised");
    }
    if (!cfg.model.rope_interleave) {
      throw UserError("model.rope_interleave: ERNIE 4.5 rotates interleaved pairs (true)");
    }
    const int64_t f = config::expert_hidden_size(cfg);
    if (e.shared_expert_hidden_size % f != 0) {
      throw UserError(
          "moe.shared_expert_hidden_size: ERNIE 4.5's shared experts are "
          "moe_num_shared_experts x moe_intermediate_size (" +
          std::to_string(f) + ")");
    }
    (void)layer_rule(cfg);
  }
  void write_config(const config::Config& cfg, json& j) const override {
    const auto& e = cfg.moe;
    const auto [start, end, interval] = layer_rule(cfg);
    j.erase("num_experts_per_tok");  // moe_k's alias: config.json keeps one
    j["moe_k"] = e.top_k;
    j["moe_num_experts"] = e.num_experts;
    j["moe_intermediate_size"] = config::expert_hidden_size(cfg);
    j["intermediate_size"] = config::dense_hidden_size(cfg);
    j["moe_num_shared_experts"] = e.shared_expert_hidden_size / config::expert_hidden_size(cfg);
    j["moe_layer_start_index"] = start;
    j["moe_layer_end_index"] = end;
    j["moe_layer_interval"] = interval;
    j["moe_norm_min"] = 1e-12;
    j["use_bias"] = false;
    j["num_nextn_predict_layers"] = nullptr;  // the MTP layer is not imported (docs/hf.md)
  }

  void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                   const std::string& our_layer, std::vector<TensorPiece>& out) const override {
    const size_t first = out.size();
    split_expert_tensors(cfg, hf_layer, our_layer, ExpertNames{}, out);
    // The correction bias is mlp.moe_statics.e_score_correction_bias, one row per group: [1, E].
    for (size_t i = first; i < out.size(); ++i) {
      if (out[i].hf == hf_layer + "mlp.gate.e_score_correction_bias") {
        out[i].hf = hf_layer + "mlp.moe_statics.e_score_correction_bias";
        out[i].hf_leading_one = true;
      }
    }
  }
  bool router_kept_fp32() const override { return true; }
  bool has_mtp_layers() const override { return true; }

 private:
  struct LayerRule {
    int64_t start, end, interval;
  };
  // Our decoder_sparse_step + mlp_only_layers from the three keys (start, end, interval).
  static void read_layer_rule(const HfKeys& k, int64_t layers, json& e) {
    const int64_t start = k.integer("moe_layer_start_index", 1);
    int64_t end = layers - 1;
    if (k.present("moe_layer_end_index") && k.raw("moe_layer_end_index") != -1) {
      end = k.integer("moe_layer_end_index");
    }
    const int64_t interval = k.integer("moe_layer_interval", 1);
    if (interval < 1) k.fail("moe_layer_interval", "expected an integer >= 1");
    if (start > end || start >= layers) {
      k.fail("moe_layer_start_index", "leaves no MoE layer (start " + std::to_string(start) +
                                          ", end " + std::to_string(end) + ", " +
                                          std::to_string(layers) + " layers)");
    }
    std::vector<int64_t> dense;
    for (int64_t i = 0; i < layers; ++i) {
      if ((i + 1) % interval == 0 && !ernie_moe_layer(i, start, end, interval)) dense.push_back(i);
    }
    e["decoder_sparse_step"] = interval;
    e["mlp_only_layers"] = dense;
  }
  // The (start, end, interval) whose layers are exactly ours; UserError when none is.
  static LayerRule layer_rule(const config::Config& cfg) {
    const int64_t layers = cfg.model.num_layers, interval = cfg.moe.decoder_sparse_step;
    int64_t start = -1, end = -1;
    for (int64_t i = 0; i < layers; ++i) {
      if (!config::is_moe_layer(cfg, i)) continue;
      if (start < 0) start = i;
      end = i;
    }
    bool same = start >= 0;
    for (int64_t i = 0; same && i < layers; ++i) {
      same = config::is_moe_layer(cfg, i) == ernie_moe_layer(i, start, end, interval);
    }
    if (!same) {
      throw UserError(
          "moe.mlp_only_layers: ERNIE 4.5's MoE layers are every moe_layer_interval-th "
          "(moe.decoder_sparse_step) from moe_layer_start_index to moe_layer_end_index; these "
          "dense layers are not such a range");
    }
    return {start, end, interval};
  }
};

}  // namespace

void register_ernie4_5_moe_family(std::vector<const ModelFamily*>& out) {
  static const Ernie45Moe kErnie45Moe;
  out.push_back(&kErnie45Moe);
}

}  // namespace moe::families
