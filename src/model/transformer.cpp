#include "moe/model/transformer.h"

#include "moe/config/parallel_dims.h"
#include "moe/kernels/permute.h"
#include "moe/kernels/rotary.h"
#include "moe/kernels/swiglu.h"
#include "moe/layers/profile_scope.h"
#include "moe/model/activation_checkpoint.h"
#include "moe/model/attention_core.h"
#include "moe/util/host_memory.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace moe::model {

namespace F = torch::nn::functional;

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // torch 2.11's fused CUDA kernel (one pass each way) takes input and weight of one dtype; a
  // bf16 input with the fp32 weight (q_norm/k_norm on a projection's output under autocast)
  // falls back to ~8 composite kernels forward, more backward, and warns. Give the weight the
  // input's dtype on CUDA, as a bf16 model holds it (Megatron; Hugging Face checkpoints store it
  // so); the output's dtype is the input's either way. Not fp16: the fused kernel's weight
  // gradient would be an fp16 sum over every row (and head), which a loss scale overflows
  // first. The CPU has no fused kernel: unchanged.
  if (x.is_cuda() && x.scalar_type() == torch::kBFloat16 &&
      weight.scalar_type() != torch::kBFloat16) {
    return at::rms_norm(x, {weight.size(0)}, weight.to(x.scalar_type()), eps_);
  }
  return at::rms_norm(x, {weight.size(0)}, weight, eps_);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const AttentionOptions& opt) : opt_(opt) {
  if (latent()) {  // multi-head latent attention: its own projections (latent_attention.cpp)
    build_latent();
    return;
  }
  const int64_t width = (opt.heads + 2 * opt.kv_heads) * opt.head_dim;
  qkv = register_module(
      "qkv", torch::nn::Linear(
                 torch::nn::LinearOptions(opt.hidden, width).bias(opt.bias || opt.qkv_bias)));
  out = register_module(
      "out", torch::nn::Linear(
                 torch::nn::LinearOptions(opt.heads * opt.head_dim, opt.hidden).bias(opt.bias)));
  if (opt.sinks) sinks = register_parameter("sinks", torch::empty({opt.heads}));
  if (opt.qk_norm) {
    const int64_t q_width = opt.qk_norm_full ? opt.heads * opt.head_dim : opt.head_dim;
    const int64_t k_width = opt.qk_norm_full ? opt.kv_heads * opt.head_dim : opt.head_dim;
    q_norm = register_module("q_norm", RMSNorm(q_width, opt.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(k_width, opt.norm_eps));
  }
  {
    torch::NoGradGuard g;
    qkv->weight.normal_(0.0, opt.init_std);
    out->weight.normal_(0.0, opt.out_init_std);
    if (qkv->bias.defined()) qkv->bias.zero_();  // transformers' init of Linear biases
    if (out->bias.defined()) out->bias.zero_();
    if (opt.sinks) sinks.normal_(0.0, opt.init_std);  // and of gpt-oss's sinks
  }
  const auto& t = opt.lora_targets;
  if (opt.lora.r == 0) return;
  const int64_t d = opt.hidden, q_out = opt.heads * opt.head_dim,
                kv_out = opt.kv_heads * opt.head_dim;
  if (t.q) lora_q = register_module("lora_q", LoraAdapter(d, q_out, opt.lora));
  if (t.k) lora_k = register_module("lora_k", LoraAdapter(d, kv_out, opt.lora));
  if (t.v) lora_v = register_module("lora_v", LoraAdapter(d, kv_out, opt.lora));
  if (t.o) lora_o = register_module("lora_o", LoraAdapter(q_out, d, opt.lora));
}

void CausalSelfAttentionImpl::merge_lora() {
  if (latent()) {
    merge_latent_lora();
    return;
  }
  torch::NoGradGuard g;
  const int64_t q_out = opt_.heads * opt_.head_dim, kv_out = opt_.kv_heads * opt_.head_dim;
  auto fold = [](LoraAdapter& a, torch::Tensor w) {
    if (!a) return;
    w.add_(a->delta_weight().to(w.scalar_type()));
    a->zero_update();
  };
  fold(lora_q, qkv->weight.narrow(0, 0, q_out));
  fold(lora_k, qkv->weight.narrow(0, q_out, kv_out));
  fold(lora_v, qkv->weight.narrow(0, q_out + kv_out, kv_out));
  fold(lora_o, out->weight);
}

torch::Tensor rotary_inv_freq(int64_t hd, double theta, const config::RopeScalingConfig& scaling,
                              const torch::TensorOptions& options) {
  using config::RopeScalingType;
  const auto f32 = options.dtype(torch::kFloat);
  // theta^(2i/hd), as HF: int64 arange -> fp32, divided by hd, the base raised to it.
  const auto exponents =
      torch::arange(0, hd, 2, f32.dtype(torch::kLong)).to(torch::kFloat) / static_cast<double>(hd);
  const auto pos_freqs = torch::pow(theta, exponents);
  switch (scaling.type) {
    case RopeScalingType::kNone:
      return 1.0 / pos_freqs;
    case RopeScalingType::kLinear:
      return (1.0 / pos_freqs) / scaling.factor;
    case RopeScalingType::kYarn:
      break;
  }
  // YaRN (arXiv 2309.00071, HF's _compute_yarn_parameters): frequencies that turn fewer than
  // beta_slow times over the pretraining window are interpolated (divided by factor), those
  // turning more than beta_fast times are kept, with a linear ramp over the dimensions between.
  const double dim = static_cast<double>(hd), orig = scaling.original_max_position_embeddings;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * std::numbers::pi))) / (2 * std::log(theta));
  };
  double low = correction_dim(scaling.beta_fast), high = correction_dim(scaling.beta_slow);
  if (scaling.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
  const auto ramp = ((torch::arange(hd / 2, f32) - low) / (high - low)).clamp(0, 1);
  const auto extrapolation_factor = 1 - ramp;
  const auto extrapolated = 1.0 / pos_freqs, interpolated = 1.0 / (scaling.factor * pos_freqs);
  return interpolated * (1 - extrapolation_factor) + extrapolated * extrapolation_factor;
}

double rotary_attention_factor(const config::RopeScalingConfig& scaling) {
  if (scaling.type != config::RopeScalingType::kYarn) return 1.0;
  if (scaling.attention_factor > 0) return scaling.attention_factor;
  return scaling.factor <= 1 ? 1.0 : 0.1 * std::log(scaling.factor) + 1.0;
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(const torch::Tensor& x, double theta,
                                                      const torch::Tensor& positions,
                                                      const config::RopeScalingConfig& scaling) {
  const int64_t S = x.size(2), hd = x.size(3);
  auto f32 = x.options().dtype(torch::kFloat);
  const auto inv_freq = rotary_inv_freq(hd, theta, scaling, f32);
  auto freqs = positions.defined()
                   ? (positions.to(torch::kFloat).unsqueeze(-1) * inv_freq).unsqueeze(1)
                   : torch::outer(torch::arange(S, f32), inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos(), sin = emb.sin();
  if (const double a = rotary_attention_factor(scaling); a != 1.0) {
    cos = cos * a, sin = sin * a;  // in fp32, before the cast, as HF
  }
  return {cos.to(x.scalar_type()), sin.to(x.scalar_type())};
}

std::pair<torch::Tensor, torch::Tensor> RotaryTableCache::get(
    const torch::Tensor& x, double theta, const torch::Tensor& positions,
    const config::RopeScalingConfig& scaling) {
  const bool fresh = cos_.defined() && S_ == x.size(2) && hd_ == x.size(3) && theta_ == theta &&
                     scaling_ == scaling && cos_.scalar_type() == x.scalar_type() &&
                     cos_.device() == x.device() &&
                     cos_.is_inference() == c10::InferenceMode::is_enabled();
  if (!fresh) {
    std::tie(cos_, sin_) = rotary_tables(x, theta, positions, scaling);
    S_ = x.size(2), hd_ = x.size(3), theta_ = theta, scaling_ = scaling;
    ++builds_;
  }
  return {cos_, sin_};
}

torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto half = x.chunk(2, -1);
  auto rotated = torch::cat({-half[1], half[0]}, -1);
  return x * cos + rotated * sin;
}

torch::Tensor apply_rotary(const torch::Tensor& x, double theta, const torch::Tensor& positions,
                           const config::RopeScalingConfig& scaling) {
  const auto [cos, sin] = rotary_tables(x, theta, positions, scaling);
  return rotate(x, cos, sin);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  if (latent()) return forward_latent(x);
  const int64_t B = x.size(0), S = x.size(1);
  const int64_t H = opt_.heads, KV = opt_.kv_heads, hd = opt_.head_dim;
  auto proj =
      qkv_4bit ? linear_4bit(x, qkv_4bit, qkv->bias) : qkv->forward(x);  // [B, S, (H + 2 KV) hd]
  if (lora_q || lora_k || lora_v) {  // each adapter's update on its rows of the fused output
    auto update = [&](LoraAdapter& a, int64_t width) {
      return a ? a->forward(x) : torch::zeros({B, S, width}, proj.options());
    };
    proj =
        proj +
        torch::cat({update(lora_q, H * hd), update(lora_k, KV * hd), update(lora_v, KV * hd)}, -1)
            .to(proj.scalar_type());
  }
  // Views of [B, S, n, hd] as [B, n, S, hd] (the strides of a plain multi-head split). One
  // split, not three narrows: split's backward is one cat of the three gradients; each narrow's
  // backward zero-fills a whole projection-sized gradient and the engine adds the three.
  const auto parts = proj.split_with_sizes({H * hd, KV * hd, KV * hd}, -1);
  auto q = parts[0], k = parts[1], v = parts[2];
  if (opt_.qk_norm && opt_.qk_norm_full) {  // OLMoE: over the whole projection
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.reshape({B, S, H, hd}), k = k.reshape({B, S, KV, hd}), v = v.reshape({B, S, KV, hd});
  if (opt_.qk_norm && !opt_.qk_norm_full) {  // Qwen3-MoE: per head
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  if (opt_.clip_qkv > 0) {
    q = q.clamp(-opt_.clip_qkv, opt_.clip_qkv);
    k = k.clamp(-opt_.clip_qkv, opt_.clip_qkv);
    v = v.clamp(-opt_.clip_qkv, opt_.clip_qkv);
  }
  q = q.transpose(1, 2), k = k.transpose(1, 2), v = v.transpose(1, 2);
  if (opt_.rope_theta > 0) {
    // Partial rotary (GLM-4.5): the first rotary_dim of each head rotate as a head of that
    // width would (its own frequencies), the rest pass through, as transformers splits them.
    const int64_t rd = opt_.rotary_dim > 0 ? opt_.rotary_dim : hd;
    torch::Tensor q_pass, k_pass;
    if (rd < hd) {
      q_pass = q.narrow(-1, rd, hd - rd), k_pass = k.narrow(-1, rd, hd - rd);
      q = q.narrow(-1, 0, rd), k = k.narrow(-1, 0, rd);
    }
    // q and k share them; so do the other layers of this forward (RotaryTableCache).
    const auto [cos, sin] = rotary_->get(q, opt_.rope_theta, positions_, opt_.rope_scaling);
    const auto dt = q.scalar_type();
    // The kernel takes whole heads; a partial rotation takes the ATen form.
    if (opt_.fused_rotary && q.is_cuda() && rd == hd &&
        (dt == torch::kFloat || dt == torch::kBFloat16 || dt == torch::kHalf)) {
      q = kernels::rotary(q, cos, sin);
      k = kernels::rotary(k, cos, sin);
    } else {
      q = rotate(q, cos, sin);
      k = rotate(k, cos, sin);
    }
    if (rd < hd) q = torch::cat({q, q_pass}, -1), k = torch::cat({k, k_pass}, -1);
  }
  if (KV != H) {  // each key/value head serves H / KV query heads
    k = k.repeat_interleave(H / KV, 1);
    v = v.repeat_interleave(H / KV, 1);
  }
  const double p = is_training() ? opt_.dropout : 0.0;
  const AttentionMasking masking{doc_mask_, opt_.window, sinks};
  // Sinks on the CPU (or moe.kernels = reference): transformers' eager attention, exactly;
  // elsewhere SDPA, which never forms the [B, H, S, S] scores (attention_core.h).
  auto y = sinks.defined() && !(opt_.fused_attention && q.is_cuda())
               ? attention_reference(q, k, v, masking, p)
               : attention_sdpa(q, k, v, masking, p);
  const auto heads = y.transpose(1, 2).reshape({B, S, H * hd});
  const auto base = out_4bit ? linear_4bit(heads, out_4bit, out->bias) : out->forward(heads);
  return lora_o ? base + lora_o->forward(heads) : base;
}

DocumentLayout document_layout(const torch::Tensor& tokens, int64_t eod) {
  const int64_t B = tokens.size(0), S = tokens.size(1);
  const auto is_eod = tokens.eq(eod).to(torch::kLong);
  const auto doc = is_eod.cumsum(1) - is_eod;  // an EOD belongs to the document it ends
  const auto causal = torch::ones({S, S}, tokens.options().dtype(torch::kBool)).tril();
  DocumentLayout l;
  l.mask = (doc.unsqueeze(2).eq(doc.unsqueeze(1)) & causal).unsqueeze(1);
  // Position = t - (index where t's document starts): starts are t = 0 and every t after an EOD.
  const auto t = torch::arange(S, tokens.options().dtype(torch::kLong)).expand({B, S});
  const auto after_eod =
      torch::cat({torch::zeros({B, 1}, is_eod.options()), is_eod.narrow(1, 0, S - 1)}, 1);
  const auto starts = torch::where(after_eod.eq(1) | t.eq(0), t, torch::zeros_like(t));
  l.positions = t - std::get<0>(starts.cummax(1));
  return l;
}

namespace {
// Latent attention's softmax scale: (nope + rope)^-0.5, times YaRN's mscale^2 where the rotary
// scaling says mscale_all_dim (transformers' yarn_apply_mscale); 0 = the default.
double latent_softmax_scale(const config::Config& cfg) {
  const auto& m = cfg.model;
  const auto& s = m.rope_scaling;
  if (!config::latent_attention(cfg) || s.type == config::RopeScalingType::kNone ||
      s.mscale_all_dim == 0) {
    return 0.0;
  }
  const double mscale = s.factor <= 1 ? 1.0 : 0.1 * s.mscale_all_dim * std::log(s.factor) + 1.0;
  return std::pow(static_cast<double>(config::qk_head_dim(cfg)), -0.5) * mscale * mscale;
}

LoraSpec lora_spec(const config::Config& cfg) {
  if (!config::lora_enabled(cfg)) return {};
  return {cfg.lora.r, config::lora_scaling(cfg.lora), cfg.lora.lora_dropout};
}

moe::MoeLayerOptions moe_options(const config::Config& cfg, const torch::Device& device,
                                 const moe::MoeParallel& parallel) {
  const auto& m = cfg.model;
  moe::MoeLayerOptions o;
  o.router.hidden_size = m.hidden_size;
  o.router.num_experts = cfg.moe.num_experts;
  o.router.top_k = cfg.moe.top_k;
  o.router.score_function = cfg.moe.score_function;
  o.router.normalize_topk = cfg.moe.normalize_topk;
  o.router.capacity_factor = cfg.moe.capacity_factor;
  o.router.router_bias_update_rate = cfg.moe.router_bias_update_rate;
  o.router.bias = cfg.moe.router_bias;
  o.router.softmax_after_topk = cfg.moe.softmax_after_topk;
  o.router.n_group = cfg.moe.n_group;
  o.router.topk_group = cfg.moe.topk_group;
  o.router.group_score_experts = cfg.moe.group_score_experts;
  o.router.routed_scaling_factor = cfg.moe.routed_scaling_factor;
  o.experts.bias = cfg.moe.expert_bias;
  o.experts.activation = cfg.moe.activation;
  o.experts.swiglu_limit = cfg.moe.swiglu_limit;
  o.experts.swiglu_alpha = cfg.moe.swiglu_alpha;
  o.router.load_reduction = parallel.loads;
  o.ep = parallel.ep;
  o.shared_expert_hidden_size = cfg.moe.shared_expert_hidden_size;
  o.dispatch_in_compute_dtype = cfg.moe.dispatch_dtype == config::DispatchDtype::kCompute;
  o.experts.num_experts = cfg.moe.num_experts;
  o.experts.hidden_size = m.hidden_size;
  o.experts.ffn_size = config::expert_hidden_size(cfg);
  o.experts.expert_dropout = cfg.moe.expert_dropout;
  o.experts.init_std = m.init_std;
  // GPT-2/Megatron: residual-output projections scaled by 1/sqrt(2L).
  o.experts.output_init_std = m.init_std / std::sqrt(2.0 * static_cast<double>(m.num_layers));
  o.kernel_path = moe::resolve_kernel_path(cfg.moe.kernels, device.is_cuda());
  o.experts.fused_swiglu = o.kernel_path == moe::KernelPath::kCuda;
  o.experts.fused_gate_up = cfg.moe.fused_gate_up;
  if (config::lora_enabled(cfg)) {
    const config::LoraTargets t = config::lora_targets(cfg.lora);
    if (t.experts_gate_up_rank > 0) {  // its own rank and alpha (config/lora.h)
      o.experts.lora_gate_up = {t.experts_gate_up_rank,
                                config::lora_scaling(t.experts_gate_up_alpha,
                                                     t.experts_gate_up_rank, cfg.lora.use_rslora),
                                cfg.lora.lora_dropout};
    }
    if (t.experts_down) o.experts.lora_down = lora_spec(cfg);
  }
  return o;
}
}  // namespace

DenseMlpImpl::DenseMlpImpl(int64_t hidden, int64_t ffn, double init_std, double out_init_std,
                           const LoraSpec& lora, const config::LoraTargets& targets) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", linear(hidden, ffn));
  up_proj = register_module("up_proj", linear(hidden, ffn));
  down_proj = register_module("down_proj", linear(ffn, hidden));
  {
    torch::NoGradGuard g;
    gate_proj->weight.normal_(0.0, init_std);
    up_proj->weight.normal_(0.0, init_std);
    down_proj->weight.normal_(0.0, out_init_std);
  }
  if (lora.r == 0) return;
  if (!targets.dense_mlp) return;
  lora_gate = register_module("lora_gate", LoraAdapter(hidden, ffn, lora));
  lora_up = register_module("lora_up", LoraAdapter(hidden, ffn, lora));
  lora_down = register_module("lora_down", LoraAdapter(ffn, hidden, lora));
}

torch::Tensor DenseMlpImpl::forward(const torch::Tensor& x) {
  auto project = [](torch::nn::Linear& base, const QuantizedWeightPtr& q, LoraAdapter& a,
                    const torch::Tensor& in) {
    const auto y = q ? linear_4bit(in, q) : base->forward(in);
    return a ? y + a->forward(in) : y;
  };
  const auto h = kernels::swiglu_activation(project(gate_proj, gate_4bit, lora_gate, x),
                                            project(up_proj, up_4bit, lora_up, x), fused_swiglu);
  return project(down_proj, down_4bit, lora_down, h);
}

void DenseMlpImpl::merge_lora() {
  torch::NoGradGuard g;
  for (auto [a, base] : {std::pair{lora_gate, gate_proj}, std::pair{lora_up, up_proj},
                         std::pair{lora_down, down_proj}}) {
    if (!a) continue;
    base->weight.add_(a->delta_weight().to(base->weight.scalar_type()));
    a->zero_update();
  }
}

BlockImpl::BlockImpl(const config::Config& cfg, const torch::Device& device, int64_t layer,
                     const moe::MoeParallel& parallel)
    : dropout_(cfg.model.dropout) {
  const auto& m = cfg.model;
  attn_norm = register_module("attn_norm", RMSNorm(m.hidden_size, m.norm_eps));
  AttentionOptions a;
  a.hidden = m.hidden_size;
  a.heads = m.num_heads;
  a.kv_heads = config::key_value_heads(cfg);
  a.head_dim = config::head_dim(cfg);
  a.rope_theta = m.rope_theta;
  a.rope_scaling = m.rope_scaling;
  a.qk_norm = m.qk_norm;
  a.qk_norm_full = m.qk_norm_scope == config::QkNormScope::kFull;
  a.clip_qkv = m.clip_qkv;
  a.bias = m.attention_bias;
  a.qkv_bias = m.qkv_bias;
  // transformers' int(head_dim * partial_rotary_factor) (validated: even, >= 2)
  a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * m.partial_rotary_factor);
  a.sinks = m.attention_sinks;
  a.window = config::attention_window(cfg, layer);
  a.norm_eps = m.norm_eps;
  a.dropout = m.dropout;
  a.init_std = m.init_std;
  // GPT-2/Megatron: residual-output projections scaled by 1/sqrt(2L).
  a.out_init_std = m.init_std / std::sqrt(2.0 * static_cast<double>(m.num_layers));
  a.lora = lora_spec(cfg);
  a.lora_targets = config::lora_targets(cfg.lora);
  // Not resolve_kernel_path: its errors are about the MoE layers' kernels (a dense model asking
  // for "cuda" on the CPU is not refused for want of a rotary kernel).
  a.fused_rotary = device.is_cuda() && cfg.moe.kernels != config::MoeKernels::kReference &&
                   kernels::cuda_kernels_compiled();
  a.fused_attention = a.fused_rotary;
  a.kv_lora_rank = m.kv_lora_rank;
  a.q_lora_rank = m.q_lora_rank;
  a.qk_nope_head_dim = m.qk_nope_head_dim;
  a.qk_rope_head_dim = m.qk_rope_head_dim;
  a.v_head_dim = m.v_head_dim;
  a.rope_interleave = m.rope_interleave;
  a.softmax_scale = latent_softmax_scale(cfg);
  attn = register_module("attn", CausalSelfAttention(a));
  moe_norm = register_module("moe_norm", RMSNorm(m.hidden_size, m.norm_eps));
  if (config::is_moe_layer(cfg, layer)) {
    moe = register_module("moe", moe::MoeLayer(moe_options(cfg, device, parallel)));
  } else {
    mlp = register_module("mlp",
                          DenseMlp(m.hidden_size, config::dense_hidden_size(cfg), m.init_std,
                                   m.init_std / std::sqrt(2.0 * static_cast<double>(m.num_layers)),
                                   lora_spec(cfg), config::lora_targets(cfg.lora)));
    mlp->fused_swiglu = a.fused_rotary;  // the same rule: CUDA, kernels compiled, not `reference`
  }
}

BlockOutput BlockImpl::forward(const torch::Tensor& x) {
  BlockOutput o;
  torch::Tensor h;
  {
    profile::Scope scope("attention");
    h = x + F::dropout(attn->forward(attn_norm->forward(x)),
                       F::DropoutFuncOptions().p(dropout_).training(is_training()));
  }
  const auto shape = h.sizes().vec();
  auto flat = moe_norm->forward(h).reshape({-1, shape.back()});
  if (mlp) {
    profile::Scope scope("dense_ffn");
    o.moe.y = mlp->forward(flat);
    o.moe.aux_loss = torch::zeros({}, h.options().dtype(torch::kFloat));
    o.moe.z_loss = torch::zeros({}, h.options().dtype(torch::kFloat));
    o.moe.tokens_per_expert = torch::zeros({0}, h.options().dtype(torch::kLong));
  } else {
    o.moe = moe->forward(flat);
  }
  o.x = h + F::dropout(o.moe.y.view(shape),
                       F::DropoutFuncOptions().p(dropout_).training(is_training()));
  return o;
}

TransformerLMImpl::TransformerLMImpl(const config::Config& cfg, const torch::Device& device,
                                     const moe::MoeParallel& parallel)
    : mcfg_(cfg.model),
      checkpoint_blocks_(cfg.activation_checkpointing.number_checkpoints),
      checkpoints_on_host_(cfg.activation_checkpointing.cpu_checkpointing),
      eod_id_(cfg.data.reset_attention_at_eod ? cfg.data.eod_id : -1) {
  const auto& m = cfg.model;
  embed = register_module("embed", torch::nn::Embedding(m.vocab_size, m.hidden_size));
  if (m.rope_theta <= 0) {  // learned absolute positions; rotary ones live in the attention
    pos_embed = register_module("pos_embed", torch::nn::Embedding(m.seq_len, m.hidden_size));
  }
  {
    torch::NoGradGuard g;
    embed->weight.normal_(0.0, m.init_std);
    if (pos_embed) pos_embed->weight.normal_(0.0, m.init_std);
  }
  lora_ = config::lora_enabled(cfg);
  const config::ExpertRange held = config::expert_range(
      cfg.moe.num_experts, std::max<int64_t>(1, parallel.ep.size), parallel.ep.rank);
  expert_rows_ = {held.first, held.count, held.total};
  base_dtype_ = lora_ ? lora_base_dtype(cfg, device) : param_dtype(cfg);
  // On a GPU each block goes to the device as soon as it is built (its frozen LoRA base in the
  // compute dtype): the host never holds the whole model, the device never its fp32 base.
  const bool to_device = device.is_cuda();
  auto list = register_module("blocks", torch::nn::ModuleList());  // names blocks.0, blocks.1...
  const auto shared_tables = std::make_shared<RotaryTableCache>();
  for (int64_t i = 0; i < m.num_layers; ++i) {
    blocks.push_back(Block(cfg, device, i, parallel));
    blocks.back()->attn->share_rotary_tables(shared_tables);
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    if (lora_) freeze_for_lora(*blocks.back(), cfg, prefix);
    if (!lora_) hold_matrices_in_16_bits(*blocks.back(), prefix);
    if (config::quantized_base(cfg)) {
      quantize_frozen(blocks.back(), prefix, quant_4bit_options(cfg, device), device);
      return_free_host_memory();  // the fp32 block's matrices: not kept by the C heap
    }
    if (to_device) blocks.back()->to(device);
    list->push_back(blocks.back());
  }
  final_norm = register_module("final_norm", RMSNorm(m.hidden_size, m.norm_eps));
  if (!m.tie_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(m.hidden_size, m.vocab_size).bias(false)));
    torch::NoGradGuard g;
    lm_head->weight.normal_(0.0, m.init_std);
  }
  if (lora_) freeze_for_lora(*this, cfg, "");
  if (!lora_) hold_matrices_in_16_bits(*this, "");
  if (to_device) this->to(device);  // the rest: embeddings, final norm, head
}

void TransformerLMImpl::hold_matrices_in_16_bits(torch::nn::Module& part,
                                                 const std::string& prefix) {
  if (base_dtype_ == torch::kFloat) return;
  torch::NoGradGuard no_grad;
  for (auto& item : part.named_parameters()) {
    auto& p = item.value();
    if (is_16bit_matrix(prefix + item.key(), p) && p.scalar_type() != base_dtype_) {
      p.set_data(p.to(base_dtype_));
    }
  }
}

void TransformerLMImpl::freeze_for_lora(torch::nn::Module& part, const config::Config& cfg,
                                        const std::string& prefix) {
  // LoRA: the base is frozen (no gradient, so no optimizer state), except what
  // lora.modules_to_save names; its matrices live in base_dtype_.
  torch::NoGradGuard no_grad;
  for (auto& item : part.named_parameters()) {
    const std::string name = prefix + item.key();
    const bool trains = config::is_lora_parameter(name) ||
                        config::saved_in_full(cfg.lora, name, cfg.model.tie_embeddings);
    auto& p = item.value();
    p.requires_grad_(trains);
    if (held_in_16_bits(name, p) && p.scalar_type() != base_dtype_) p.set_data(p.to(base_dtype_));
  }
}

void TransformerLMImpl::quantize_frozen(Block& block, const std::string& prefix,
                                        const Quant4bitOptions& opt, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  // Emptied, not removed: the parameter keeps its name (checkpoints, the fingerprint's order).
  auto quantize = [&](const std::string& name, torch::Tensor& p, QuantizedWeightPtr& slot,
                      bool experts, std::vector<int64_t> rows = {}) {
    if (p.requires_grad()) return;  // trains in full (lora.modules_to_save)
    slot = experts ? QuantizedWeight::experts(p, opt) : QuantizedWeight::linear(p, rows, opt);
    slot->to(device);  // the block moves with Module::to(), which does not see the 4-bit state
    quantized_[prefix + name] = slot;
    p.set_data(torch::empty({0}, p.options()));
  };
  if (!block->moe.is_empty()) {
    auto& e = *block->moe->experts;
    quantize("moe.experts.w_gate", e.w_gate, e.gate_4bit, true);
    quantize("moe.experts.w_up", e.w_up, e.up_4bit, true);
    quantize("moe.experts.w_down", e.w_down, e.down_4bit, true);
  }
  if (opt.mxfp4) return;  // MXFP4: the experts only (transformers' Mxfp4Config)
  auto& a = *block->attn;
  if (a.latent()) {
    for (auto [name, linear, slot] : {std::tuple{"attn.q_proj.weight", &a.q_proj, &a.q_proj_4bit},
                                      {"attn.q_a_proj.weight", &a.q_a_proj, &a.q_a_4bit},
                                      {"attn.q_b_proj.weight", &a.q_b_proj, &a.q_b_4bit},
                                      {"attn.kv_a_proj.weight", &a.kv_a_proj, &a.kv_a_4bit},
                                      {"attn.kv_b_proj.weight", &a.kv_b_proj, &a.kv_b_4bit},
                                      {"attn.out.weight", &a.out, &a.out_4bit}}) {
      if (!linear->is_empty()) quantize(name, (*linear)->weight, *slot, false);
    }
  }
  if (!a.latent()) {
    const int64_t width = a.qkv->weight.size(0), out_in = a.out->weight.size(1);
    const int64_t kv_rows = (width - out_in) / 2;  // q: heads * hd = out's input width
    quantize("attn.qkv.weight", a.qkv->weight, a.qkv_4bit, false, {out_in, kv_rows, kv_rows});
    quantize("attn.out.weight", a.out->weight, a.out_4bit, false);
  }
  if (block->mlp) {
    auto& m = *block->mlp;
    quantize("mlp.gate_proj.weight", m.gate_proj->weight, m.gate_4bit, false);
    quantize("mlp.up_proj.weight", m.up_proj->weight, m.up_4bit, false);
    quantize("mlp.down_proj.weight", m.down_proj->weight, m.down_4bit, false);
  }
}

int64_t TransformerLMImpl::quantized_bytes() const {
  int64_t b = 0;
  for (const auto& [name, q] : quantized_) b += q->bytes();
  return b;
}

void TransformerLMImpl::dequantize_base() {
  if (quantized_.empty()) return;
  torch::NoGradGuard no_grad;
  auto params = named_parameters();
  for (const auto& [name, q] : quantized_)
    params[name].set_data(q->dequantize(torch::kFloat).contiguous());
  for (auto& b : blocks) {
    auto& a = *b->attn;
    a.qkv_4bit = a.out_4bit = a.q_proj_4bit = a.q_a_4bit = a.q_b_4bit = nullptr;
    a.kv_a_4bit = a.kv_b_4bit = nullptr;
    if (b->mlp) b->mlp->gate_4bit = b->mlp->up_4bit = b->mlp->down_4bit = nullptr;
    if (!b->moe.is_empty()) {
      auto& e = *b->moe->experts;
      e.gate_4bit = e.up_4bit = e.down_4bit = nullptr;
    }
  }
  quantized_.clear();
}

BaseDtypeAutocast::BaseDtypeAutocast(const TransformerLM& model) {
  const auto dtype = model->base_dtype();
  on_ = dtype != torch::kFloat && !model->parameters().empty();
  if (!on_) return;
  device_type_ = model->parameters().front().device().type();
  was_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype);
}

BaseDtypeAutocast::~BaseDtypeAutocast() {
  if (!on_) return;
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

torch::ScalarType param_dtype(const config::Config& cfg) {
  switch (cfg.training.param_dtype) {
    case config::ParamDtype::kBf16:
      return torch::kBFloat16;
    case config::ParamDtype::kFp16:
      return torch::kHalf;
    case config::ParamDtype::kFp32:
      break;
  }
  return torch::kFloat;
}

torch::ScalarType lora_base_dtype(const config::Config& cfg, const torch::Device& device) {
  if (!device.is_cuda()) return torch::kFloat;
  if (cfg.bf16.enabled) return torch::kBFloat16;
  if (cfg.fp16.enabled) return torch::kHalf;
  return torch::kFloat;
}

void TransformerLMImpl::merge_lora() {
  dequantize_base();  // PEFT's merge over a 4-bit base: into the dequantized weights
  for (auto& b : blocks) {
    b->attn->merge_lora();
    if (b->mlp) b->mlp->merge_lora();
    if (!b->moe.is_empty()) b->moe->experts->merge_lora();
  }
}

torch::Tensor TransformerLMImpl::head_weight() const {
  return lm_head ? lm_head->weight : embed->weight;
}

LmOutput TransformerLMImpl::forward(const torch::Tensor& tokens, bool logits) {
  LmOutput out;
  const int64_t S = tokens.size(1);
  torch::Tensor x;
  {
    profile::Scope scope("embedding");
    DocumentLayout docs;
    if (eod_id_ >= 0) docs = document_layout(tokens, eod_id_);
    for (auto& b : blocks) b->attn->set_documents(docs.mask, docs.positions);
    x = embed->forward(tokens);
    if (pos_embed) {
      x = x + (docs.positions.defined()
                   ? pos_embed->forward(docs.positions)
                   : pos_embed->forward(torch::arange(S, tokens.options())).unsqueeze(0));
    }
    // A 16-bit frozen base (LoRA) embeds in 16 bits; the residual stream stays fp32.
    if (x.scalar_type() != torch::kFloat) x = x.to(torch::kFloat);
    // A frozen embedding gives an input without a gradient; a checkpointed block's recompute
    // then would not reach the adapters inside it (HF's enable_input_require_grads).
    if (is_training() && torch::GradMode::is_enabled() && !x.requires_grad() &&
        checkpoint_blocks_ > 0) {
      x = x.detach().requires_grad_(true);
    }
  }
  out.aux_loss = torch::zeros({}, x.options().dtype(torch::kFloat));
  out.z_loss = torch::zeros({}, x.options().dtype(torch::kFloat));
  for (size_t i = 0; i < blocks.size(); ++i) {
    profile::Layer layer(static_cast<int64_t>(i));
    // The first `checkpoint_blocks_` blocks keep only their input during training.
    BlockOutput bo = is_training() && static_cast<int64_t>(i) < checkpoint_blocks_ &&
                             torch::GradMode::is_enabled()
                         ? checkpointed_block_forward(blocks[i], x, checkpoints_on_host_)
                         : blocks[i]->forward(x);
    x = bo.x;
    out.aux_loss = out.aux_loss + bo.moe.aux_loss;
    out.z_loss = out.z_loss + bo.moe.z_loss;
    if (blocks[i]->is_moe()) out.tokens_per_expert.push_back(bo.moe.tokens_per_expert);
    out.dropped += bo.moe.dropped;
  }
  profile::Scope scope("head");
  x = final_norm->forward(x);
  out.hidden = x;
  if (logits) out.logits = lm_head ? lm_head->forward(x) : F::linear(x, embed->weight);
  return out;
}

void TransformerLMImpl::after_optimizer_step(const std::vector<torch::Tensor>& tokens_per_expert) {
  size_t next = 0;  // tokens_per_expert holds MoE layers only
  for (auto& block : blocks) {
    if (!block->is_moe()) continue;
    if (next == tokens_per_expert.size()) break;
    block->moe->after_optimizer_step(tokens_per_expert[next++]);
  }
}

std::optional<TransformerLMImpl::ExpertRows> TransformerLMImpl::expert_rows(
    const std::string& name) const {
  if (expert_rows_.count == expert_rows_.total) return std::nullopt;
  if (name.find(".moe.experts.") == std::string::npos) return std::nullopt;
  return expert_rows_;
}

}  // namespace moe::model
