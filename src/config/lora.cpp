#include "moe/config/lora.h"

#include <algorithm>
#include <cmath>

namespace moe::config {

namespace {

bool has(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool lora_enabled(const Config& c) { return c.lora.r > 0; }

LoraTargets lora_targets(const LoraConfig& l) {
  const bool all = has(l.target_modules, "all-linear");  // PEFT's: every nn.Linear but the head
  auto on = [&](const char* n) { return all || has(l.target_modules, n); };
  LoraTargets t;
  t.q = on("q_proj");
  t.k = on("k_proj");
  t.v = on("v_proj");
  t.o = on("o_proj");
  t.q_a = on("q_a_proj");
  t.q_b = on("q_b_proj");
  t.kv_a = on("kv_a_proj_with_mqa");
  t.kv_b = on("kv_b_proj");
  t.dense_mlp = has(l.target_modules, "dense_mlp");
  const bool split_pair = (on("gate_proj") && on("up_proj")) || (on("w1") && on("w3"));
  if (split_pair) {
    t.experts_gate_up_rank = 2 * l.r;
    t.experts_gate_up_alpha = 2 * l.lora_alpha;
  } else if (has(l.target_modules, "gate_up_proj")) {
    t.experts_gate_up_rank = l.r;
    t.experts_gate_up_alpha = l.lora_alpha;
  }
  t.experts_down = on("down_proj") || on("w2");
  t.experts_up = on("up_proj");
  t.in_proj = on("in_proj");
  t.out_proj = on("out_proj");
  t.in_proj_qkv = on("in_proj_qkv");
  t.in_proj_z = on("in_proj_z");
  t.in_proj_b = on("in_proj_b");
  t.in_proj_a = on("in_proj_a");
  t.in_proj_qkvz = on("in_proj_qkvz");
  t.in_proj_ba = on("in_proj_ba");
  t.shared_expert_gate = on("shared_expert_gate");
  return t;
}

double lora_scaling(double alpha, int64_t r, bool rslora) {
  const double rank = static_cast<double>(r);
  return rslora ? alpha / std::sqrt(rank) : alpha / rank;
}

double lora_scaling(const LoraConfig& l) { return lora_scaling(l.lora_alpha, l.r, l.use_rslora); }

bool is_lora_parameter(const std::string& name) { return name.find(".lora_") != std::string::npos; }

bool saved_in_full(const LoraConfig& l, const std::string& name, bool tie_embeddings) {
  const auto& s = l.modules_to_save;
  if (has(s, "gate") && name.find(".moe.router.") != std::string::npos) return true;
  if (has(s, "embed_tokens") && name.rfind("embed.", 0) == 0) return true;
  if (has(s, "lm_head") &&
      (name.rfind("lm_head.", 0) == 0 || (tie_embeddings && name == "embed.weight"))) {
    return true;
  }
  // PEFT matches modules_to_save by suffix: "norm" is every norm (model.norm, the layernorms,
  // q_norm, k_norm).
  const bool any_norm = has(s, "norm");
  if (any_norm && (name.rfind("final_norm.", 0) == 0 || ends_with(name, "_norm.weight"))) {
    return true;
  }
  if (has(s, "input_layernorm") && ends_with(name, ".attn_norm.weight")) return true;
  if (has(s, "post_attention_layernorm") && ends_with(name, ".moe_norm.weight")) return true;
  if (has(s, "q_norm") && ends_with(name, ".attn.q_norm.weight")) return true;
  if (has(s, "k_norm") && ends_with(name, ".attn.k_norm.weight")) return true;
  return false;
}

namespace {

// The adapter parameters of one attention block with multi-head latent attention: q_proj or
// q_a/q_b, kv_a, kv_b, o (no k_proj / v_proj).
int64_t latent_attention_adapter(const Config& c, const LoraTargets& t) {
  const auto& m = c.model;
  const int64_t r = c.lora.r, d = m.hidden_size, H = m.num_heads;
  const int64_t qk = qk_head_dim(c), qr = m.q_lora_rank, kvr = m.kv_lora_rank;
  int64_t n = 0;
  if (t.q && qr == 0) n += r * (d + H * qk);
  if (t.q_a && qr > 0) n += r * (d + qr);
  if (t.q_b && qr > 0) n += r * (qr + H * qk);
  if (t.kv_a) n += r * (d + kvr + m.qk_rope_head_dim);
  if (t.kv_b) n += r * (kvr + H * (m.qk_nope_head_dim + m.v_head_dim));
  if (t.o) n += r * (H * m.v_head_dim + d);
  return n;
}

// The adapter parameters of one attention block (q, k, v, o; or the latent projections).
int64_t attention_adapter(const Config& c, const LoraTargets& t) {
  if (latent_attention(c)) return latent_attention_adapter(c, t);
  const int64_t r = c.lora.r, d = c.model.hidden_size, H = c.model.num_heads;
  const int64_t KV = key_value_heads(c), hd = head_dim(c);
  // Gated attention's q_proj gives the queries and their output gate (Qwen3-Next, Qwen3.5).
  const int64_t q_out = H * hd * (c.model.attention_output_gate ? 2 : 1);
  int64_t n = 0;
  if (t.q) n += r * (d + q_out);
  if (t.k) n += r * (d + KV * hd);
  if (t.v) n += r * (d + KV * hd);
  if (t.o) n += r * (H * hd + d);
  return n;
}

// The adapter parameters of one Gated DeltaNet layer: its split or fused input projections and
// out_proj.
int64_t linear_attention_adapter(const Config& c, const LoraTargets& t) {
  const auto& m = c.model;
  const int64_t r = c.lora.r, d = m.hidden_size, nv = m.linear_num_value_heads;
  const int64_t kd = m.linear_num_key_heads * m.linear_key_head_dim;
  const int64_t vd = nv * m.linear_value_head_dim, conv = 2 * kd + vd;
  int64_t n = t.out_proj ? r * (vd + d) : 0;
  if (m.linear_fused_projections) {
    if (t.in_proj_qkvz) n += r * (d + conv + vd);
    if (t.in_proj_ba) n += r * (d + 2 * nv);
    return n;
  }
  if (t.in_proj_qkv) n += r * (d + conv);
  if (t.in_proj_z) n += r * (d + vd);
  if (t.in_proj_b) n += r * (d + nv);
  if (t.in_proj_a) n += r * (d + nv);
  return n;
}

// Whether the MoE layers have a sigmoid-gated shared expert (its gate is an adapter target).
bool gated_shared_expert(const Config& c) {
  return c.moe.shared_expert_hidden_size > 0 && c.moe.shared_expert_gate;
}

// Every adapter of the model: attention in each layer, then the experts (MoE layers) or the
// dense MLP (dense layers).
int64_t adapter_parameters(const Config& c, const LoraTargets& t) {
  const int64_t r = c.lora.r, d = c.model.hidden_size, E = c.moe.num_experts;
  const int64_t f = expert_hidden_size(c), fd = dense_hidden_size(c);
  const int64_t per_attention = attention_adapter(c, t);
  const int64_t inner = mamba_inner_size(c), conv = mamba_conv_channels(c);
  const int64_t per_mamba = (t.in_proj ? r * (d + inner + conv + c.model.mamba_num_heads) : 0) +
                            (t.out_proj ? r * (inner + d) : 0);
  // Gated experts: gate and up in one adapter of rank experts_gate_up_rank; relu2: up alone.
  const int64_t up_rank = gated_mlp(c) ? t.experts_gate_up_rank : (t.experts_up ? r : 0);
  const int64_t up_width = gated_mlp(c) ? 2 * f : f;
  int64_t n = 0;
  for (int64_t layer = 0; layer < c.model.num_layers; ++layer) {
    if (has_mixer(c, layer) && mamba_layer(c, layer)) {
      n += per_mamba;
    } else if (has_mixer(c, layer) && linear_attention_layer(c, layer)) {
      n += linear_attention_adapter(c, t);
    } else if (has_mixer(c, layer)) {
      n += per_attention;
    }
    if (!has_feed_forward(c, layer)) continue;
    if (is_moe_layer(c, layer)) {  // the experts at their own width (LatentMoE: the latent)
      const int64_t de = expert_model_size(c);
      if (t.shared_expert_gate && gated_shared_expert(c)) n += r * (d + 1);
      n += E * up_rank * (de + up_width);
      if (t.experts_down) n += E * r * (f + de);
    } else if (t.dense_mlp) {
      n += (gated_mlp(c) ? 3 : 2) * r * (d + fd);
    }
  }
  return n;
}

// The norms modules_to_save trains in full ("norm" is every norm, as PEFT's suffix match).
int64_t saved_norm_parameters(const Config& c) {
  const auto& s = c.lora.modules_to_save;
  const int64_t d = c.model.hidden_size, L = c.model.num_layers, hd = head_dim(c);
  const bool all_norms = has(s, "norm");
  auto saved = [&](const char* name) { return all_norms || has(s, name); };
  int64_t n = all_norms ? d : 0;  // final_norm
  if (saved("input_layernorm")) n += L * d;
  if (saved("post_attention_layernorm")) n += L * d;
  if (c.model.qk_norm) {
    const bool full = c.model.qk_norm_scope == QkNormScope::kFull;
    if (saved("q_norm")) n += L * (full ? c.model.num_heads * hd : hd);
    if (saved("k_norm")) n += L * (full ? key_value_heads(c) * hd : hd);
  }
  return n;
}

// The base parameters modules_to_save trains in full: router, embeddings, head, norms.
int64_t saved_base_parameters(const Config& c) {
  const auto& s = c.lora.modules_to_save;
  const int64_t d = c.model.hidden_size, V = c.model.vocab_size;
  int64_t n = 0;
  if (has(s, "gate")) n += moe_layer_count(c) * d * c.moe.num_experts;
  const bool embed = has(s, "embed_tokens") || (has(s, "lm_head") && c.model.tie_embeddings);
  if (embed) n += V * d + (c.model.rope_theta > 0 ? 0 : c.model.seq_len * d);
  if (has(s, "lm_head") && !c.model.tie_embeddings) n += V * d;
  return n + saved_norm_parameters(c);
}

}  // namespace

LoraParameterCounts lora_parameter_counts(const Config& c) {
  LoraParameterCounts n;
  const int64_t total = count_parameters(c);
  if (!lora_enabled(c)) {
    n.trainable_base = total;
    return n;
  }
  n.adapter = adapter_parameters(c, lora_targets(c.lora));
  n.trainable_base = saved_base_parameters(c);
  n.frozen_base = total - n.trainable_base;
  return n;
}

}  // namespace moe::config
