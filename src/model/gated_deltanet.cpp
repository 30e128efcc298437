#include "moe/model/gated_deltanet.h"

#include <cmath>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include "moe/config/lora.h"
#include "moe/model/block.h"
#include "moe/model/block_parts.h"
#include "moe/model/cached_conv1d.h"
#include "moe/model/gated_delta_rule.h"
#include "moe/model/linear_token_mixer.h"

namespace moe::model {

namespace F = torch::nn::functional;

namespace {
torch::nn::Linear no_bias_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
}  // namespace

GatedDeltaNetImpl::GatedDeltaNetImpl(const GatedDeltaNetOptions& opt) : opt_(opt) {
  const int64_t d = opt.hidden, nv = opt.value_heads;
  const int64_t kd = opt.key_heads * opt.key_head_dim, vd = nv * opt.value_head_dim;
  const int64_t conv = 2 * kd + vd;
  // named_parameters: dt_bias and A_log (the module's own), then the submodules in this order
  // (parameter_layout.cpp lists it too).
  if (opt.fused_projections) {
    in_proj_qkvz = register_module("in_proj_qkvz", no_bias_linear(d, conv + vd));
    in_proj_ba = register_module("in_proj_ba", no_bias_linear(d, 2 * nv));
  } else {
    in_proj_qkv = register_module("in_proj_qkv", no_bias_linear(d, conv));
    in_proj_z = register_module("in_proj_z", no_bias_linear(d, vd));
    in_proj_b = register_module("in_proj_b", no_bias_linear(d, nv));
    in_proj_a = register_module("in_proj_a", no_bias_linear(d, nv));
  }
  conv1d = register_module("conv1d", WeightOnly(torch::empty({conv, 1, opt.conv_kernel})));
  dt_bias = register_parameter("dt_bias", torch::ones({nv}));
  // transformers' init: A uniform in [0.01, 16] (so the decay rates span slow to fast).
  A_log = register_parameter("A_log", torch::empty({nv}).uniform_(0.01, 16).log());
  norm = register_module("norm", WeightOnly(torch::ones({opt.value_head_dim})));
  out_proj = register_module("out_proj", no_bias_linear(vd, d));
  register_adapters(d, conv, vd);
  torch::NoGradGuard no_grad;
  for (auto* l : {&in_proj_qkv, &in_proj_z, &in_proj_b, &in_proj_a, &in_proj_qkvz, &in_proj_ba}) {
    if (*l) (*l)->weight.normal_(0.0, opt.init_std);
  }
  // nn.Conv1d's default (kaiming uniform over a fan-in of K for a depthwise conv).
  const double bound = 1.0 / std::sqrt(static_cast<double>(opt.conv_kernel));
  conv1d->weight.uniform_(-bound, bound);
  out_proj->weight.normal_(0.0, opt.out_init_std);
}

void GatedDeltaNetImpl::register_adapters(int64_t d, int64_t conv, int64_t vd) {
  if (opt_.lora.r == 0) return;
  const int64_t nv = opt_.value_heads;
  // In the projections' order (parameter_layout.cpp lists them so).
  for (auto [on, slot, name, out] : {std::tuple{opt_.lora_qkv, &lora_qkv, "lora_qkv", conv},
                                     {opt_.lora_z, &lora_z, "lora_z", vd},
                                     {opt_.lora_b, &lora_b, "lora_b", nv},
                                     {opt_.lora_a, &lora_a, "lora_a", nv},
                                     {opt_.lora_qkvz, &lora_qkvz, "lora_qkvz", conv + vd},
                                     {opt_.lora_ba, &lora_ba, "lora_ba", 2 * nv}}) {
    if (on) *slot = register_module(name, layers::LoraAdapter(d, out, opt_.lora));
  }
  if (opt_.lora_out) lora_out = register_module("lora_out", layers::LoraAdapter(vd, d, opt_.lora));
}

torch::Tensor GatedDeltaNetImpl::linear(const torch::Tensor& x, torch::nn::Linear& base,
                                        const layers::QuantizedWeightPtr& q,
                                        layers::LoraAdapter& adapter) {
  const auto y = q ? layers::linear_4bit(x, q) : base->forward(x);
  return adapter ? y + adapter->forward(x) : y;
}

void GatedDeltaNetImpl::merge_lora() {
  torch::NoGradGuard no_grad;
  for (auto [a, base] : {std::pair{lora_qkv, in_proj_qkv}, std::pair{lora_z, in_proj_z},
                         std::pair{lora_b, in_proj_b}, std::pair{lora_a, in_proj_a},
                         std::pair{lora_qkvz, in_proj_qkvz}, std::pair{lora_ba, in_proj_ba},
                         std::pair{lora_out, out_proj}}) {
    if (!a) continue;
    base->weight.add_(a->delta_weight().to(base->weight.scalar_type()));
    a->zero_update();
  }
}

GatedDeltaNetImpl::Projected GatedDeltaNetImpl::project(const torch::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1), nk = opt_.key_heads, nv = opt_.value_heads;
  const int64_t dk = opt_.key_head_dim, dv = opt_.value_head_dim, r = nv / nk;
  if (!opt_.fused_projections) {
    return {linear(x, in_proj_qkv, in_proj_qkv_4bit, lora_qkv),
            linear(x, in_proj_z, in_proj_z_4bit, lora_z).view({B, S, nv, dv}),
            linear(x, in_proj_b, in_proj_b_4bit, lora_b),
            linear(x, in_proj_a, in_proj_a_4bit, lora_a)};
  }
  // Qwen3-Next: per key head, [q (dk) | k (dk) | its r value heads (r dv) | their z (r dv)] and
  // [its r b | its r a]; an adapter's update is in the same order (it adds to the whole output).
  const auto qkvz =
      linear(x, in_proj_qkvz, in_proj_qkvz_4bit, lora_qkvz).view({B, S, nk, 2 * dk + 2 * r * dv});
  const auto parts = qkvz.split_with_sizes({dk, dk, r * dv, r * dv}, -1);
  const auto ba = linear(x, in_proj_ba, in_proj_ba_4bit, lora_ba)
                      .view({B, S, nk, 2 * r})
                      .split_with_sizes({r, r}, -1);
  const auto flat = [&](const torch::Tensor& t) { return t.reshape({B, S, -1}); };
  return {torch::cat({flat(parts[0]), flat(parts[1]), flat(parts[2])}, -1),
          parts[3].reshape({B, S, nv, dv}), flat(ba[0]), flat(ba[1])};
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1), nk = opt_.key_heads, nv = opt_.value_heads;
  const int64_t dk = opt_.key_head_dim, dv = opt_.value_head_dim, kd = nk * dk;
  // Generation: padding slots enter as zeros, which leave the conv and the state at zero
  // (transformers' apply_mask_to_padding_states), so a left-padded row runs as if alone.
  const auto p =
      project(cache_ ? x * step_->valid.narrow(1, step_->past, S).unsqueeze(-1).to(x.dtype()) : x);
  const auto mixed = convolve(p.qkv);
  const auto qkv = mixed.split_with_sizes({kd, kd, nv * dv}, -1);
  DeltaRuleInputs in;
  in.q = qkv[0].reshape({B, S, nk, dk});
  in.k = qkv[1].reshape({B, S, nk, dk});
  in.v = qkv[2].reshape({B, S, nv, dv});
  in.beta = torch::sigmoid(p.b);
  in.g = -A_log.to(torch::kFloat).exp() * F::softplus(p.a.to(torch::kFloat) + dt_bias);
  in.positions = positions_;
  const auto core = delta_rule(in);  // [B, S, nv, dv]
  const auto normed = gated_rms_norm(core, p.z, norm->weight, opt_.norm_eps);
  return linear(normed.reshape({B, S, nv * dv}), out_proj, out_proj_4bit, lora_out);
}

torch::Tensor GatedDeltaNetImpl::convolve(const torch::Tensor& qkv) {
  if (cache_ == nullptr) return causal_conv1d_silu(qkv, conv1d->weight, positions_);
  return cached_causal_conv1d_silu(qkv, conv1d->weight, {}, *cache_);
}

torch::Tensor GatedDeltaNetImpl::delta_rule(const DeltaRuleInputs& in) {
  if (cache_ == nullptr) return chunk_gated_delta_rule(in).o;
  // A prefill runs chunked from zeros; what follows a cached state steps the recurrence (one
  // token at a time, as transformers does; the chunked form here starts from zeros only).
  DeltaRuleOutput out = cache_->recurrent.defined()
                            ? recurrent_gated_delta_rule(in, cache_->recurrent)
                            : chunk_gated_delta_rule(in);
  cache_->recurrent = out.final_state;
  return out.o;
}

torch::Tensor gated_rms_norm(const torch::Tensor& x, const torch::Tensor& gate,
                             const torch::Tensor& weight, double eps) {
  const auto dtype = x.scalar_type();
  const auto x32 = x.to(torch::kFloat);
  const auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (weight * normed.to(dtype) * torch::silu(gate.to(torch::kFloat))).to(dtype);
}

std::shared_ptr<TokenMixer> gated_deltanet_mixer(BlockImpl& block, const BlockContext& ctx) {
  const auto& m = ctx.cfg.model;
  GatedDeltaNetOptions o;
  o.hidden = m.hidden_size;
  o.key_heads = m.linear_num_key_heads;
  o.value_heads = m.linear_num_value_heads;
  o.key_head_dim = m.linear_key_head_dim;
  o.value_head_dim = m.linear_value_head_dim;
  o.conv_kernel = m.linear_conv_kernel_dim;
  o.fused_projections = m.linear_fused_projections;
  o.norm_eps = m.norm_eps;
  o.init_std = m.init_std;
  o.out_init_std = output_init_std(ctx.cfg);
  o.lora = lora_spec(ctx.cfg);
  if (o.lora.r > 0) {
    const config::LoraTargets t = config::lora_targets(ctx.cfg.lora);
    const bool fused = o.fused_projections;
    o.lora_qkv = !fused && t.in_proj_qkv;
    o.lora_z = !fused && t.in_proj_z;
    o.lora_b = !fused && t.in_proj_b;
    o.lora_a = !fused && t.in_proj_a;
    o.lora_qkvz = fused && t.in_proj_qkvz;
    o.lora_ba = fused && t.in_proj_ba;
    o.lora_out = t.out_proj;
  }
  block.linear_attn = block.register_module("linear_attn", GatedDeltaNet(o));
  return std::make_shared<LinearTokenMixer<GatedDeltaNet>>(block.linear_attn);
}

}  // namespace moe::model
