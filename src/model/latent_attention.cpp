// Multi-head latent attention (DeepSeek-V2/V3, Kimi, Moonlight): the modules, forward and
// adapter merge of CausalSelfAttention when model.kv_lora_rank > 0, in transformers'
// DeepseekV3Attention order of operations:
//   q = q_proj(x), or q_b_proj(q_a_norm(q_a_proj(x)))                  [B, S, H (nope + rope)]
//   [latent | k_rot] = kv_a_proj(x)                                      [B, S, kvr + rope]
//   [k_nope | v] = kv_b_proj(kv_a_norm(latent))                          [B, S, H (nope + v)]
//   rotary on q's rope part and on k_rot, one rotary key shared by every head
//   softmax((q_nope k_nope + q_rot k_rot) scale) v, scale = (nope + rope)^-0.5 (x YaRN mscale^2)
// Its norms use eps 1e-6 whatever model.norm_eps is (transformers' DeepseekV3RMSNorm default,
// which the attention's norms are built with).
#include <torch/torch.h>

#include "moe/layers/lora.h"
#include "moe/model/attention_core.h"
#include "moe/model/transformer.h"

namespace moe::model {

namespace {

constexpr double kLatentNormEps = 1e-6;

torch::nn::Linear plain_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

void CausalSelfAttentionImpl::build_latent() {
  const auto& o = opt_;
  const int64_t d = o.hidden, H = o.heads, qk = o.qk_nope_head_dim + o.qk_rope_head_dim;
  const int64_t kv_b_out = H * (o.qk_nope_head_dim + o.v_head_dim);
  if (o.q_lora_rank > 0) {
    q_a_proj = register_module("q_a_proj", plain_linear(d, o.q_lora_rank));
    q_a_norm = register_module("q_a_norm", RMSNorm(o.q_lora_rank, kLatentNormEps));
    q_b_proj = register_module("q_b_proj", plain_linear(o.q_lora_rank, H * qk));
  } else {
    q_proj = register_module("q_proj", plain_linear(d, H * qk));
  }
  kv_a_proj = register_module("kv_a_proj", plain_linear(d, o.kv_lora_rank + o.qk_rope_head_dim));
  kv_a_norm = register_module("kv_a_norm", RMSNorm(o.kv_lora_rank, kLatentNormEps));
  kv_b_proj = register_module("kv_b_proj", plain_linear(o.kv_lora_rank, kv_b_out));
  out = register_module("out", plain_linear(H * o.v_head_dim, d));
  {
    torch::NoGradGuard g;
    for (auto* l : {&q_proj, &q_a_proj, &q_b_proj, &kv_a_proj, &kv_b_proj}) {
      if (!l->is_empty()) (*l)->weight.normal_(0.0, o.init_std);
    }
    out->weight.normal_(0.0, o.out_init_std);
  }
  if (o.lora.r == 0) return;
  const auto& t = o.lora_targets;
  if (t.q && o.q_lora_rank == 0)
    lora_q = register_module("lora_q", layers::LoraAdapter(d, H * qk, o.lora));
  if (t.q_a && o.q_lora_rank > 0) {
    lora_q_a = register_module("lora_q_a", layers::LoraAdapter(d, o.q_lora_rank, o.lora));
  }
  if (t.q_b && o.q_lora_rank > 0) {
    lora_q_b = register_module("lora_q_b", layers::LoraAdapter(o.q_lora_rank, H * qk, o.lora));
  }
  if (t.kv_a) {
    lora_kv_a = register_module(
        "lora_kv_a", layers::LoraAdapter(d, o.kv_lora_rank + o.qk_rope_head_dim, o.lora));
  }
  if (t.kv_b)
    lora_kv_b = register_module("lora_kv_b", layers::LoraAdapter(o.kv_lora_rank, kv_b_out, o.lora));
  if (t.o) lora_o = register_module("lora_o", layers::LoraAdapter(H * o.v_head_dim, d, o.lora));
}

torch::Tensor CausalSelfAttentionImpl::forward_latent(const torch::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1), H = opt_.heads;
  const int64_t nope = opt_.qk_nope_head_dim, rope = opt_.qk_rope_head_dim;
  const int64_t kvr = opt_.kv_lora_rank, vd = opt_.v_head_dim;
  // base(in) [+ adapter(in)], the base 4-bit where quantized.
  auto project = [](torch::nn::Linear& base, const layers::QuantizedWeightPtr& q4,
                    layers::LoraAdapter& a, const torch::Tensor& in) {
    const auto y = q4 ? layers::linear_4bit(in, q4) : base->forward(in);
    return a ? y + a->forward(in).to(y.scalar_type()) : y;
  };
  const auto q_flat = opt_.q_lora_rank > 0
                          ? project(q_b_proj, q_b_4bit, lora_q_b,
                                    q_a_norm->forward(project(q_a_proj, q_a_4bit, lora_q_a, x)))
                          : project(q_proj, q_proj_4bit, lora_q, x);
  auto q = q_flat.view({B, S, H, nope + rope}).transpose(1, 2);  // [B, H, S, nope + rope]
  const auto q_parts = q.split_with_sizes({nope, rope}, -1);
  const auto compressed = project(kv_a_proj, kv_a_4bit, lora_kv_a, x);  // [B, S, kvr + rope]
  const auto kv_parts = compressed.split_with_sizes({kvr, rope}, -1);
  const auto kv = project(kv_b_proj, kv_b_4bit, lora_kv_b, kv_a_norm->forward(kv_parts[0]))
                      .view({B, S, H, nope + vd})
                      .transpose(1, 2);  // [B, H, S, nope + v]
  const auto k_and_v = kv.split_with_sizes({nope, vd}, -1);
  auto q_rot = q_parts[1];
  auto k_rot = kv_parts[1].view({B, 1, S, rope});
  if (opt_.rope_interleave) q_rot = pairs_as_halves(q_rot), k_rot = pairs_as_halves(k_rot);
  const auto [cos, sin] = rotary_->get(q_rot, opt_.rope_theta, positions_, opt_.rope_scaling);
  q_rot = rotate(q_rot, cos, sin);
  k_rot = rotate(k_rot, cos, sin);
  auto q_full = torch::cat({q_parts[0], q_rot}, -1);
  if (const auto s = llama_4_query_scale(q_full, positions_, opt_.rope_scaling); s.defined()) {
    q_full = q_full * s.to(q_full.scalar_type());  // Mistral Small 4, past the window
  }
  // Generation caches the expanded per-head keys and values (as transformers' DynamicCache).
  const AttendedKeys keys =
      attend(torch::cat({k_and_v[0], k_rot.expand({B, H, S, rope})}, -1), k_and_v[1]);
  const double p = is_training() ? opt_.dropout : 0.0;
  AttentionMasking masking{doc_mask_, opt_.window, {}};
  masking.scale = opt_.softmax_scale;
  masking.cached = keys.mask;
  // SDPA everywhere (attention_core.h): on CUDA the q/k and v widths differ, which torch's
  // memory-efficient kernel takes (memory linear in S); the CPU runs its math form.
  const auto y = attention_sdpa(q_full, keys.k, keys.v, masking, p);  // [B, H, S, v]
  const auto heads = y.transpose(1, 2).reshape({B, S, H * vd});
  return project(out, out_4bit, lora_o, heads);
}

void CausalSelfAttentionImpl::merge_latent_lora() {
  torch::NoGradGuard g;
  auto fold = [](layers::LoraAdapter& a, torch::nn::Linear& base) {
    if (!a || base.is_empty()) return;
    base->weight.add_(a->delta_weight().to(base->weight.scalar_type()));
    a->zero_update();
  };
  fold(lora_q, q_proj);
  fold(lora_q_a, q_a_proj);
  fold(lora_q_b, q_b_proj);
  fold(lora_kv_a, kv_a_proj);
  fold(lora_kv_b, kv_b_proj);
  fold(lora_o, out);
}

}  // namespace moe::model
