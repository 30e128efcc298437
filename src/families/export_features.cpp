// The features beyond the common core, each with the config key that turns it on: export-hf
// refuses one its target family lacks and names the families that have it.
#include <functional>

#include "moe/families/model_family.h"
#include "moe/util/errors.h"

namespace moe::families {

namespace {

struct FeatureUse {
  Feature feature;
  const char* key;
  std::function<bool(const config::Config&)> used;
};

// In the order the refusals are checked.
const std::vector<FeatureUse>& feature_uses() {
  using config::Config;
  static const std::vector<FeatureUse> kUses = {
      {Feature::kAttentionBias, "model.attention_bias",
       [](const Config& c) { return c.model.attention_bias; }},
      {Feature::kAttentionSinks, "model.attention_sinks",
       [](const Config& c) { return c.model.attention_sinks; }},
      {Feature::kSlidingWindow, "model.sliding_window",
       [](const Config& c) { return c.model.sliding_window > 0; }},
      {Feature::kRouterBias, "moe.router_bias", [](const Config& c) { return c.moe.router_bias; }},
      {Feature::kSoftmaxAfterTopk, "moe.softmax_after_topk",
       [](const Config& c) { return c.moe.softmax_after_topk; }},
      {Feature::kExpertBias, "moe.expert_bias", [](const Config& c) { return c.moe.expert_bias; }},
      {Feature::kClampedSwiglu, "moe.activation",
       [](const Config& c) {
         return c.moe.activation == config::ExpertActivation::kClampedSwiglu;
       }},
      {Feature::kGeglu, "moe.activation",
       [](const Config& c) { return c.moe.activation == config::ExpertActivation::kGeglu; }},
      {Feature::kLatentAttention, "model.kv_lora_rank",
       [](const Config& c) { return config::latent_attention(c); }},
      {Feature::kRopeInterleave, "model.rope_interleave",
       [](const Config& c) { return c.model.rope_interleave; }},
      {Feature::kGroupScoreBest1, "moe.group_score_experts",
       [](const Config& c) { return c.moe.n_group > 1 && c.moe.group_score_experts != 2; }},
      {Feature::kSharedExperts, "moe.shared_expert_hidden_size",
       [](const Config& c) { return c.moe.shared_expert_hidden_size > 0; }},
      {Feature::kSigmoidScores, "moe.score_function",
       [](const Config& c) { return c.moe.score_function != config::ScoreFunction::kSoftmax; }},
      {Feature::kSelectionBias, "moe.router_bias_update_rate",
       [](const Config& c) { return c.moe.router_bias_update_rate > 0; }},
      {Feature::kExpertGroups, "moe.n_group", [](const Config& c) { return c.moe.n_group > 1; }},
      {Feature::kRoutedScaling, "moe.routed_scaling_factor",
       [](const Config& c) { return c.moe.routed_scaling_factor != 1.0; }},
      {Feature::kQkvBias, "model.qkv_bias", [](const Config& c) { return c.model.qkv_bias; }},
      {Feature::kPartialRotary, "model.partial_rotary_factor",
       [](const Config& c) { return c.model.partial_rotary_factor != 1.0; }},
      {Feature::kQkNorm, "model.qk_norm", [](const Config& c) { return c.model.qk_norm; }},
      {Feature::kClipQkv, "model.clip_qkv", [](const Config& c) { return c.model.clip_qkv > 0; }},
      {Feature::kLinearAttention, "model.layer_types",
       [](const Config& c) { return c.model.linear_num_key_heads > 0; }},
      {Feature::kAttentionOutputGate, "model.attention_output_gate",
       [](const Config& c) { return c.model.attention_output_gate; }},
      {Feature::kZeroCenteredNorm, "model.zero_centered_norm",
       [](const Config& c) { return c.model.zero_centered_norm; }},
      {Feature::kSharedExpertGate, "moe.shared_expert_gate",
       [](const Config& c) { return c.moe.shared_expert_gate; }},
      {Feature::kQueryPositionScale, "model.rope_scaling.llama_4_scaling_beta",
       [](const Config& c) { return c.model.rope_scaling.llama_4_scaling_beta > 0; }},
      {Feature::kGlobalAttention, "model.global_head_dim",
       [](const Config& c) {
         const auto& m = c.model;
         return m.global_head_dim > 0 || m.global_num_key_value_heads > 0 || m.attention_k_eq_v ||
                m.global_rope_theta > 0 || m.global_partial_rotary_factor != 1.0;
       }},
      {Feature::kValueNorm, "model.value_norm", [](const Config& c) { return c.model.value_norm; }},
      {Feature::kAttentionScale, "model.attention_scale",
       [](const Config& c) { return c.model.attention_scale > 0; }},
      {Feature::kScaledEmbeddings, "model.scale_embeddings",
       [](const Config& c) { return c.model.scale_embeddings; }},
      {Feature::kLogitSoftcap, "model.final_logit_softcapping",
       [](const Config& c) { return c.model.final_logit_softcapping > 0; }},
      {Feature::kSandwichNorms, "model.sandwich_norms",
       [](const Config& c) { return c.model.sandwich_norms; }},
      {Feature::kLayerScalar, "model.layer_scalar",
       [](const Config& c) { return c.model.layer_scalar; }},
      {Feature::kParallelDense, "moe.parallel_dense",
       [](const Config& c) { return c.moe.parallel_dense; }},
      {Feature::kRouterInputNorm, "moe.router_input_norm",
       [](const Config& c) { return c.moe.router_input_norm || c.moe.per_expert_scale; }},
      {Feature::kDenseLayers, "moe.mlp_only_layers",
       [](const Config& c) {
         for (int64_t l = 0; l < c.model.num_layers; ++l) {
           if (config::has_feed_forward(c, l) && !config::is_moe_layer(c, l)) return true;
         }
         return false;
       }},
      {Feature::kMamba, "model.mamba_num_heads",
       [](const Config& c) { return c.model.mamba_num_heads > 0; }},
      {Feature::kSublayerBlocks, "model.sublayer_blocks",
       [](const Config& c) { return c.model.sublayer_blocks; }},
      {Feature::kNoPositions, "model.no_position_encoding",
       [](const Config& c) { return c.model.no_position_encoding; }},
      {Feature::kMultipliers, "model.residual_multiplier",
       [](const Config& c) {
         const auto& m = c.model;
         return m.embedding_multiplier != 1.0 || m.residual_multiplier != 1.0 ||
                m.logits_scaling != 1.0;
       }},
      {Feature::kRelu2, "moe.activation",
       [](const Config& c) { return c.moe.activation == config::ExpertActivation::kRelu2; }},
      {Feature::kLatentExperts, "moe.latent_size",
       [](const Config& c) { return c.moe.latent_size > 0; }},
  };
  return kUses;
}

}  // namespace

void refuse_missing_features(const config::Config& cfg, const ModelFamily& family) {
  for (const FeatureUse& use : feature_uses()) {
    if (family.has(use.feature) || !use.used(cfg)) continue;
    std::vector<const ModelFamily*> owners;
    for (const ModelFamily* f : all_families()) {
      if (f->has(use.feature)) owners.push_back(f);
    }
    const std::string who = owners.empty() ? std::string("no family") : listed(owners, true, "and");
    throw UserError(std::string(use.key) + ": " + family.model_type() + " has no such setting; " +
                    "only " + who + (owners.size() == 1 ? " has" : " have") +
                    " it among the families export-hf writes");
  }
}

}  // namespace moe::families
