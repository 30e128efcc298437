#include "moe/model/mamba2_mixer.h"

#include <cmath>
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

ConvWeightsImpl::ConvWeightsImpl(int64_t channels, int64_t kernel, bool with_bias) {
  // nn.Conv1d's default init (kaiming uniform over a fan-in of K for a depthwise conv).
  const double bound = 1.0 / std::sqrt(static_cast<double>(kernel));
  weight =
      register_parameter("weight", torch::empty({channels, 1, kernel}).uniform_(-bound, bound));
  if (with_bias)
    bias = register_parameter("bias", torch::empty({channels}).uniform_(-bound, bound));
}

Mamba2MixerImpl::Mamba2MixerImpl(const Mamba2Options& opt) : opt_(opt) {
  const int64_t H = opt.heads, inner = H * opt.head_dim;
  const int64_t conv = inner + 2 * opt.groups * opt.state_size;
  // named_parameters: dt_bias, A_log and D (the module's own), then the submodules in this order
  // (parameter_layout.cpp lists it too).
  // Mamba-2's init: dt log-uniform in [1e-3, 1e-1] floored at 1e-4, stored through the inverse
  // softplus; A = 1..H; D = 1.
  const auto dt = torch::exp(torch::rand({H}) * (std::log(0.1) - std::log(1e-3)) + std::log(1e-3))
                      .clamp_min(1e-4);
  dt_bias = register_parameter("dt_bias", dt + torch::log(-torch::expm1(-dt)));
  A_log = register_parameter("A_log", torch::arange(1, H + 1, torch::kFloat).log());
  D = register_parameter("D", torch::ones({H}));
  in_proj = register_module(
      "in_proj", torch::nn::Linear(
                     torch::nn::LinearOptions(opt.hidden, inner + conv + H).bias(opt.proj_bias)));
  conv1d = register_module("conv1d", ConvWeights(conv, opt.conv_kernel, opt.conv_bias));
  norm = register_module("norm", NormWeight(inner));
  out_proj = register_module(
      "out_proj",
      torch::nn::Linear(torch::nn::LinearOptions(inner, opt.hidden).bias(opt.proj_bias)));
  if (opt.lora.r > 0 && opt.lora_in) {
    lora_in =
        register_module("lora_in", layers::LoraAdapter(opt.hidden, inner + conv + H, opt.lora));
  }
  if (opt.lora.r > 0 && opt.lora_out) {
    lora_out = register_module("lora_out", layers::LoraAdapter(inner, opt.hidden, opt.lora));
  }
  torch::NoGradGuard no_grad;
  in_proj->weight.normal_(0.0, opt.init_std);
  out_proj->weight.normal_(0.0, opt.out_init_std);
  for (auto* l : {&in_proj, &out_proj}) {
    if ((*l)->bias.defined()) (*l)->bias.zero_();
  }
}

torch::Tensor Mamba2MixerImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1), H = opt_.heads, P = opt_.head_dim;
  const int64_t G = opt_.groups, N = opt_.state_size, inner = H * P;
  // Generation: padding slots enter as zeros and leave the conv as zeros (transformers'
  // apply_mask_to_padding_states, before in_proj and after the conv), so a left-padded row runs
  // as if alone.
  const auto valid =
      cache_ ? step_->valid.narrow(1, step_->past, S).unsqueeze(-1) : torch::Tensor();
  const auto projected =
      project(valid.defined() ? x * valid.to(x.dtype()) : x, in_proj, in_proj_4bit, lora_in);
  const auto parts = projected.split_with_sizes({inner, inner + 2 * G * N, H}, -1);
  auto xbc = convolve(parts[1]);
  if (valid.defined()) xbc = xbc * valid.to(xbc.dtype());
  const auto xs = xbc.split_with_sizes({inner, G * N, G * N}, -1);
  SsdInputs in;
  in.x = xs[0].view({B, S, H, P});
  in.B = xs[1].view({B, S, G, N});
  in.C = xs[2].view({B, S, G, N});
  auto dt = F::softplus(parts[2].to(torch::kFloat) + dt_bias.to(torch::kFloat));
  if (opt_.dt_min > 0 || opt_.dt_max > 0) {
    dt = opt_.dt_max > 0 ? dt.clamp(opt_.dt_min, opt_.dt_max) : dt.clamp_min(opt_.dt_min);
  }
  in.dt = dt;
  in.A = -A_log.to(torch::kFloat).exp();
  in.D = D;
  in.positions = positions_;
  const auto y = scan(in).y.reshape({B, S, inner});  // fp32
  const auto normed = group_gated_rms_norm(y, parts[0], norm->weight, G, opt_.norm_eps);
  return project(normed.to(x.scalar_type()), out_proj, out_proj_4bit, lora_out);
}

torch::Tensor Mamba2MixerImpl::project(const torch::Tensor& x, torch::nn::Linear& base,
                                       const layers::QuantizedWeightPtr& q,
                                       layers::LoraAdapter& adapter) {
  // A 4-bit base exists only without biases (transformer.cpp quantizes no biased projection).
  const auto y = q ? layers::linear_4bit(x, q) : base->forward(x);
  return adapter ? y + adapter->forward(x) : y;
}

void Mamba2MixerImpl::merge_lora() {
  torch::NoGradGuard no_grad;
  for (auto [a, base] : {std::pair{lora_in, in_proj}, std::pair{lora_out, out_proj}}) {
    if (!a) continue;
    base->weight.add_(a->delta_weight().to(base->weight.scalar_type()));
    a->zero_update();
  }
}

torch::Tensor Mamba2MixerImpl::convolve(const torch::Tensor& xbc) {
  if (cache_ == nullptr) return causal_conv1d_silu(xbc, conv1d->weight, positions_, conv1d->bias);
  return cached_causal_conv1d_silu(xbc, conv1d->weight, conv1d->bias, *cache_);
}

SsdOutput Mamba2MixerImpl::scan(const SsdInputs& in) {
  if (cache_ == nullptr) return chunk_ssd_scan(in, opt_.chunk);
  // A prefill runs chunked from zeros; what follows a cached state steps the recurrence.
  SsdOutput out = cache_->recurrent.defined() ? recurrent_ssd_scan(in, cache_->recurrent)
                                              : chunk_ssd_scan(in, opt_.chunk);
  cache_->recurrent = out.final_state;
  return out;
}

torch::Tensor group_gated_rms_norm(const torch::Tensor& x, const torch::Tensor& gate,
                                   const torch::Tensor& weight, int64_t groups, double eps) {
  const auto gated = x.to(torch::kFloat) * torch::silu(gate.to(torch::kFloat));
  auto sizes = gated.sizes().vec();
  const int64_t width = sizes.back();
  auto grouped_shape = sizes;
  grouped_shape.back() = groups;
  grouped_shape.push_back(width / groups);
  const auto g = gated.view(grouped_shape);
  const auto normed = (g * torch::rsqrt(g.pow(2).mean(-1, /*keepdim=*/true) + eps)).view(sizes);
  return weight.to(torch::kFloat) * normed;
}

std::shared_ptr<TokenMixer> mamba2_mixer(BlockImpl& block, const BlockContext& ctx) {
  const auto& m = ctx.cfg.model;
  Mamba2Options o;
  o.hidden = m.hidden_size;
  o.heads = m.mamba_num_heads;
  o.head_dim = m.mamba_head_dim;
  o.state_size = m.ssm_state_size;
  o.groups = m.mamba_n_groups;
  o.conv_kernel = m.mamba_conv_kernel;
  o.chunk = m.mamba_chunk_size;
  o.conv_bias = m.mamba_conv_bias;
  o.proj_bias = m.mamba_proj_bias;
  o.dt_min = m.mamba_dt_min;
  o.dt_max = m.mamba_dt_max;
  o.norm_eps = m.norm_eps;
  o.init_std = m.init_std;
  o.out_init_std = output_init_std(ctx.cfg);
  o.lora = lora_spec(ctx.cfg);
  if (o.lora.r > 0) {
    const config::LoraTargets t = config::lora_targets(ctx.cfg.lora);
    o.lora_in = t.in_proj;
    o.lora_out = t.out_proj;
  }
  block.mamba = block.register_module("mamba", Mamba2Mixer(o));
  return std::make_shared<LinearTokenMixer<Mamba2Mixer>>(block.mamba);
}

}  // namespace moe::model
