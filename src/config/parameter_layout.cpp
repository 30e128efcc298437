#include "moe/config/parameter_layout.h"

#include "moe/config/lora.h"

namespace moe::config {

namespace {

// A LoRA adapter's two tensors (layers/lora.h): lora_A [r, in], lora_B [out, r]; experts'
// stacked: lora_A [E, in, r], lora_B [E, r, out].
void adapter(std::vector<ParameterShape>& out, const std::string& prefix, int64_t in, int64_t out_w,
             int64_t r, int64_t experts = 0) {
  if (experts > 0) {
    out.push_back({prefix + ".lora_A", {experts, in, r}});
    out.push_back({prefix + ".lora_B", {experts, r, out_w}});
  } else {
    out.push_back({prefix + ".lora_A", {r, in}});
    out.push_back({prefix + ".lora_B", {out_w, r}});
  }
}

// The fused q/k/v attention's parameters, in its registration order.
void attention_layout(std::vector<ParameterShape>& p, const config::Config& c, const std::string& b,
                      int64_t layer) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, H = m.num_heads, KV = config::layer_key_value_heads(c, layer);
  const int64_t hd = config::layer_head_dim(c, layer), r = c.lora.r;
  const int64_t v_rows = config::keys_are_values(c, layer) ? 0 : KV * hd;
  const bool lora = config::lora_enabled(c);
  const config::LoraTargets t = config::lora_targets(c.lora);
  // With an output gate, q_proj's rows hold a gate per head after its query (attention.h).
  const int64_t q_rows = (m.attention_output_gate ? 2 : 1) * H * hd;
  if (m.attention_sinks) p.push_back({b + "attn.sinks", {H}});  // the module's own: first
  p.push_back({b + "attn.qkv.weight", {q_rows + KV * hd + v_rows, d}});
  if (m.attention_bias || m.qkv_bias)
    p.push_back({b + "attn.qkv.bias", {q_rows + KV * hd + v_rows}});
  p.push_back({b + "attn.out.weight", {d, H * hd}});
  if (m.attention_bias) p.push_back({b + "attn.out.bias", {d}});
  if (m.qk_norm) {
    const bool full = m.qk_norm_scope == config::QkNormScope::kFull;
    p.push_back({b + "attn.q_norm.weight", {full ? H * hd : hd}});
    p.push_back({b + "attn.k_norm.weight", {full ? KV * hd : hd}});
  }
  if (lora) {
    if (t.q) adapter(p, b + "attn.lora_q", d, q_rows, r);
    if (t.k) adapter(p, b + "attn.lora_k", d, KV * hd, r);
    if (t.v && v_rows > 0) adapter(p, b + "attn.lora_v", d, KV * hd, r);
    if (t.o) adapter(p, b + "attn.lora_o", H * hd, d, r);
  }
}

// Multi-head latent attention's (model/latent_attention.cpp), in its registration order.
void latent_attention_layout(std::vector<ParameterShape>& p, const config::Config& c,
                             const std::string& b) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, H = m.num_heads, qk = config::qk_head_dim(c);
  const int64_t qr = m.q_lora_rank, kvr = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const int64_t kv_b = H * (m.qk_nope_head_dim + m.v_head_dim), r = c.lora.r;
  if (qr > 0) {
    p.push_back({b + "attn.q_a_proj.weight", {qr, d}});
    p.push_back({b + "attn.q_a_norm.weight", {qr}});
    p.push_back({b + "attn.q_b_proj.weight", {H * qk, qr}});
  } else {
    p.push_back({b + "attn.q_proj.weight", {H * qk, d}});
  }
  p.push_back({b + "attn.kv_a_proj.weight", {kvr + rope, d}});
  p.push_back({b + "attn.kv_a_norm.weight", {kvr}});
  p.push_back({b + "attn.kv_b_proj.weight", {kv_b, kvr}});
  p.push_back({b + "attn.out.weight", {d, H * m.v_head_dim}});
  if (!config::lora_enabled(c)) return;
  const config::LoraTargets t = config::lora_targets(c.lora);
  if (t.q && qr == 0) adapter(p, b + "attn.lora_q", d, H * qk, r);
  if (t.q_a && qr > 0) adapter(p, b + "attn.lora_q_a", d, qr, r);
  if (t.q_b && qr > 0) adapter(p, b + "attn.lora_q_b", qr, H * qk, r);
  if (t.kv_a) adapter(p, b + "attn.lora_kv_a", d, kvr + rope, r);
  if (t.kv_b) adapter(p, b + "attn.lora_kv_b", kvr, kv_b, r);
  if (t.o) adapter(p, b + "attn.lora_o", H * m.v_head_dim, d, r);
}

// Gated DeltaNet's (model/gated_deltanet.cpp), in its registration order.
void linear_attention_layout(std::vector<ParameterShape>& p, const config::Config& c,
                             const std::string& b) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, nv = m.linear_num_value_heads;
  const int64_t kd = m.linear_num_key_heads * m.linear_key_head_dim;
  const int64_t vd = nv * m.linear_value_head_dim, conv = 2 * kd + vd;
  const std::string a = b + "linear_attn.";
  // The module's own tensors first, then its submodules' (torch's named_parameters order).
  p.push_back({a + "dt_bias", {nv}});
  p.push_back({a + "A_log", {nv}});
  if (m.linear_fused_projections) {
    p.push_back({a + "in_proj_qkvz.weight", {conv + vd, d}});
    p.push_back({a + "in_proj_ba.weight", {2 * nv, d}});
  } else {
    p.push_back({a + "in_proj_qkv.weight", {conv, d}});
    p.push_back({a + "in_proj_z.weight", {vd, d}});
    p.push_back({a + "in_proj_b.weight", {nv, d}});
    p.push_back({a + "in_proj_a.weight", {nv, d}});
  }
  p.push_back({a + "conv1d.weight", {conv, 1, m.linear_conv_kernel_dim}});
  p.push_back({a + "norm.weight", {m.linear_value_head_dim}});
  p.push_back({a + "out_proj.weight", {d, vd}});
  if (!config::lora_enabled(c)) return;  // the adapters in the projections' order
  const config::LoraTargets t = config::lora_targets(c.lora);
  const int64_t r = c.lora.r;
  const bool fused = m.linear_fused_projections;
  if (!fused && t.in_proj_qkv) adapter(p, a + "lora_qkv", d, conv, r);
  if (!fused && t.in_proj_z) adapter(p, a + "lora_z", d, vd, r);
  if (!fused && t.in_proj_b) adapter(p, a + "lora_b", d, nv, r);
  if (!fused && t.in_proj_a) adapter(p, a + "lora_a", d, nv, r);
  if (fused && t.in_proj_qkvz) adapter(p, a + "lora_qkvz", d, conv + vd, r);
  if (fused && t.in_proj_ba) adapter(p, a + "lora_ba", d, 2 * nv, r);
  if (t.out_proj) adapter(p, a + "lora_out", vd, d, r);
}

// Mamba-2's (model/mamba2_mixer.cpp), in its registration order.
void mamba_layout(std::vector<ParameterShape>& p, const config::Config& c, const std::string& b) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, H = m.mamba_num_heads, inner = config::mamba_inner_size(c);
  const int64_t conv = config::mamba_conv_channels(c), in = inner + conv + H;
  const std::string a = b + "mamba.";
  p.push_back({a + "dt_bias", {H}});  // the module's own tensors first
  p.push_back({a + "A_log", {H}});
  p.push_back({a + "D", {H}});
  p.push_back({a + "in_proj.weight", {in, d}});
  if (m.mamba_proj_bias) p.push_back({a + "in_proj.bias", {in}});
  p.push_back({a + "conv1d.weight", {conv, 1, m.mamba_conv_kernel}});
  if (m.mamba_conv_bias) p.push_back({a + "conv1d.bias", {conv}});
  p.push_back({a + "norm.weight", {inner}});
  p.push_back({a + "out_proj.weight", {d, inner}});
  if (m.mamba_proj_bias) p.push_back({a + "out_proj.bias", {d}});
  if (!config::lora_enabled(c)) return;
  const config::LoraTargets t = config::lora_targets(c.lora);
  if (t.in_proj) adapter(p, a + "lora_in", d, in, c.lora.r);
  if (t.out_proj) adapter(p, a + "lora_out", inner, d, c.lora.r);
}

// The MoE layer's (moe/moe_layer.h), in its registration order.
void moe_layout(std::vector<ParameterShape>& p, const config::Config& c, const std::string& b) {
  const int64_t d = c.model.hidden_size, E = c.moe.num_experts;
  const int64_t f = config::expert_hidden_size(c), r = c.lora.r;
  const bool lora = config::lora_enabled(c);
  const config::LoraTargets t = config::lora_targets(c.lora);
  {
    p.push_back({b + "moe.router.weight", {E, d}});
    if (c.moe.router_bias) p.push_back({b + "moe.router.bias", {E}});
    if (c.moe.router_input_norm) p.push_back({b + "moe.router.input_scale", {d}});
    if (c.moe.per_expert_scale) p.push_back({b + "moe.router.expert_scale", {E}});
    const bool gated = config::gated_mlp(c);
    const int64_t de = config::expert_model_size(c);  // the latent width under moe.latent_size
    if (gated) p.push_back({b + "moe.experts.w_gate", {E, de, f}});
    p.push_back({b + "moe.experts.w_up", {E, de, f}});
    p.push_back({b + "moe.experts.w_down", {E, f, de}});
    if (c.moe.expert_bias) {
      p.push_back({b + "moe.experts.b_gate", {E, f}});
      p.push_back({b + "moe.experts.b_up", {E, f}});
      p.push_back({b + "moe.experts.b_down", {E, de}});
    }
    const int64_t up_rank = gated ? t.experts_gate_up_rank : (t.experts_up ? r : 0);
    if (lora && up_rank > 0) {
      adapter(p, b + "moe.experts.lora_gate_up", de, (gated ? 2 : 1) * f, up_rank, E);
    }
    if (lora && t.experts_down) adapter(p, b + "moe.experts.lora_down", f, de, r, E);
    if (const int64_t fs = c.moe.shared_expert_hidden_size; fs > 0) {
      if (gated) p.push_back({b + "moe.shared_expert.w_gate", {1, d, fs}});
      p.push_back({b + "moe.shared_expert.w_up", {1, d, fs}});
      p.push_back({b + "moe.shared_expert.w_down", {1, fs, d}});
      if (c.moe.shared_expert_gate) {
        p.push_back({b + "moe.shared_expert_gate.weight", {1, d}});
        if (lora && t.shared_expert_gate) adapter(p, b + "moe.lora_shared_expert_gate", d, 1, r);
      }
    }
    if (c.moe.latent_size > 0) {
      p.push_back({b + "moe.latent_in.weight", {de, d}});
      p.push_back({b + "moe.latent_out.weight", {d, de}});
    }
  }
}

}  // namespace

std::vector<ParameterShape> parameter_layout(const config::Config& c) {
  const auto& m = c.model;
  const int64_t d = m.hidden_size, fd = config::dense_hidden_size(c);
  const bool lora = config::lora_enabled(c);
  const config::LoraTargets t = config::lora_targets(c.lora);
  const int64_t r = c.lora.r;
  std::vector<ParameterShape> p;
  p.push_back({"embed.weight", {m.vocab_size, d}});
  if (config::learned_positions(c)) p.push_back({"pos_embed.weight", {m.seq_len, d}});
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    if (m.layer_scalar) p.push_back({b + "layer_scalar", {1}});  // the block's own: first
    if (config::has_mixer(c, i)) {
      p.push_back({b + "attn_norm.weight", {d}});
      if (config::linear_attention_layer(c, i)) {
        linear_attention_layout(p, c, b);
      } else if (config::mamba_layer(c, i)) {
        mamba_layout(p, c, b);
      } else if (config::latent_attention(c)) {
        latent_attention_layout(p, c, b);
      } else {
        attention_layout(p, c, b, i);
      }
      if (m.sandwich_norms) p.push_back({b + "attn_post_norm.weight", {d}});
    }
    if (!config::has_feed_forward(c, i)) continue;
    p.push_back({b + "moe_norm.weight", {d}});
    const bool moe = config::is_moe_layer(c, i), parallel = moe && c.moe.parallel_dense;
    if (parallel) p.push_back({b + "mlp_norm.weight", {d}});
    if (!moe || parallel) {
      if (config::gated_mlp(c)) p.push_back({b + "mlp.gate_proj.weight", {fd, d}});
      p.push_back({b + "mlp.up_proj.weight", {fd, d}});
      p.push_back({b + "mlp.down_proj.weight", {d, fd}});
      if (lora && t.dense_mlp) {
        if (config::gated_mlp(c)) adapter(p, b + "mlp.lora_gate", d, fd, r);
        adapter(p, b + "mlp.lora_up", d, fd, r);
        adapter(p, b + "mlp.lora_down", fd, d, r);
      }
    }
    if (parallel) p.push_back({b + "mlp_post_norm.weight", {d}});
    if (moe) moe_layout(p, c, b);
    if (parallel) p.push_back({b + "moe_post_norm.weight", {d}});
    if (m.sandwich_norms) p.push_back({b + "ffn_post_norm.weight", {d}});
  }
  p.push_back({"final_norm.weight", {d}});
  if (!m.tie_embeddings) p.push_back({"lm_head.weight", {m.vocab_size, d}});
  return p;
}

}  // namespace moe::config
