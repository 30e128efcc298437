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
#include <cmath>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "moe/layers/lora.h"
#include "moe/model/attention_core.h"
#include "moe/model/decode_cache.h"
#include "moe/model/transformer.h"

namespace moe::model {

namespace {

constexpr double kLatentNormEps = 1e-6;

torch::nn::Linear plain_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Latent attention's widths, as the cached path needs them.
struct LatentWidths {
  int64_t nope, rope, kvr, v, window;
};

// Attention over per-head keys and values expanded from latents c [B, T, kvr] and the rotary
// keys [B, 1, T, rope] they share, under the given masking: training's and a prefill's form.
using ExpandedAttention = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                                      const AttentionMasking&)>;

// Generation caches what DeepSeek's MLA was made to cache: per slot the normalised latent and
// the rotated rotary key [B, 1, T, kvr + rope], shared by every head (DeepSeek-V3: 576 values a
// slot where the expanded keys and values take 128 x 320). A prefill expands the cached latents
// through kv_b_proj and attends as training does; a decode step absorbs kv_b_proj's
// weight [H (nope + v), kvr] (`kv_b_weight`) into the query and the output instead
// (q_nope W_uk . c = q_nope . k_nope; (p c) W_uv^T = p v), so its cost does not grow with
// H x (nope + v) per cached slot.
torch::Tensor latent_cached_attention(LayerCache& cache, const DecodeStep& step,
                                      const LatentWidths& w, const torch::Tensor& q_full,
                                      const torch::Tensor& latent, const torch::Tensor& k_rot,
                                      AttentionMasking masking, const ExpandedAttention& expanded,
                                      const std::function<torch::Tensor()>& kv_b_weight) {
  const int64_t B = q_full.size(0), H = q_full.size(1), S = q_full.size(2);
  const auto entry = torch::cat({latent.unsqueeze(1), k_rot.to(latent.scalar_type())}, -1);
  const AttendedKeys keys = attend_cached(cache, step, entry, entry.narrow(-1, 0, 0), w.window);
  const int64_t T = keys.k.size(2);
  masking.cached = keys.mask;
  if (S > 1) {
    return expanded(keys.k.narrow(-1, 0, w.kvr).squeeze(1), keys.k.narrow(-1, w.kvr, w.rope),
                    masking);
  }
  const auto per_head = kv_b_weight().to(q_full.scalar_type()).view({H, w.nope + w.v, w.kvr});
  const auto q_parts = q_full.split_with_sizes({w.nope, w.rope}, -1);
  const auto q_latent = torch::matmul(q_parts[0], per_head.narrow(1, 0, w.nope));  // [B,H,S,kvr]
  const auto q_absorbed = torch::cat({q_latent, q_parts[1]}, -1);
  // The absorbed query is wider than nope + rope: the scale stays the expanded form's.
  if (masking.scale <= 0) masking.scale = 1.0 / std::sqrt(static_cast<double>(w.nope + w.rope));
  const auto k = keys.k.to(q_absorbed.scalar_type());
  const auto y_latent =
      attention_sdpa(q_absorbed, k.expand({B, H, T, w.kvr + w.rope}),
                     k.narrow(-1, 0, w.kvr).expand({B, H, T, w.kvr}), masking, 0.0);
  return torch::matmul(y_latent, per_head.narrow(1, w.nope, w.v).transpose(1, 2));  // [B,H,S,v]
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
  const auto latent = kv_a_norm->forward(kv_parts[0]);  // [B, S, kvr]
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
  const double p = is_training() ? opt_.dropout : 0.0;
  AttentionMasking masking{doc_mask_, opt_.window, {}};
  masking.scale = opt_.softmax_scale;
  // Per-head [k_nope | v] of latents c [B, T, kvr] through kv_b_proj, the rotary key joined to
  // every head's k_nope. SDPA everywhere (attention_core.h): on CUDA the q/k and v widths
  // differ, which torch's memory-efficient kernel takes (memory linear in S); the CPU runs its
  // math form.
  auto expanded = [&](const torch::Tensor& c, const torch::Tensor& rot, const AttentionMasking& m) {
    const int64_t T = c.size(1);
    const auto k_and_v = project(kv_b_proj, kv_b_4bit, lora_kv_b, c)
                             .view({B, T, H, nope + vd})
                             .transpose(1, 2)
                             .split_with_sizes({nope, vd}, -1);
    const auto k_rot_heads = rot.expand({B, H, T, rope}).to(k_and_v[0].scalar_type());
    return attention_sdpa(q_full, torch::cat({k_and_v[0], k_rot_heads}, -1), k_and_v[1], m, p);
  };
  torch::Tensor y;  // [B, H, S, v]
  if (cache_ == nullptr) {
    y = expanded(latent, k_rot, masking);
  } else {
    // kv_b_proj's whole weight [H (nope + v), kvr] as its forward applies it.
    auto kv_b_weight = [&] {
      auto w = kv_b_4bit ? kv_b_4bit->dequantize(q_full.scalar_type()) : kv_b_proj->weight;
      return lora_kv_b ? w + lora_kv_b->delta_weight().to(w.scalar_type()) : w;
    };
    y = latent_cached_attention(*cache_, *step_, {nope, rope, kvr, vd, opt_.window}, q_full, latent,
                                k_rot, masking, expanded, kv_b_weight);
  }
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
