#include "moe/model/attention.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include "moe/kernels/rotary.h"
#include "moe/model/attention_core.h"
#include "moe/model/block.h"
#include "moe/model/block_parts.h"

namespace moe::model {

namespace F = torch::nn::functional;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const AttentionOptions& opt) : opt_(opt) {
  if (latent()) {  // multi-head latent attention: its own projections (latent_attention.cpp)
    build_latent();
    return;
  }
  const int64_t width = q_rows() + kv_rows() + v_rows();
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
    q_norm = register_module("q_norm", RMSNorm(q_width, opt.norm_eps, opt.zero_centered_norm));
    k_norm = register_module("k_norm", RMSNorm(k_width, opt.norm_eps, opt.zero_centered_norm));
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
  if (t.q) lora_q = register_module("lora_q", layers::LoraAdapter(d, q_rows(), opt.lora));
  if (t.k) lora_k = register_module("lora_k", layers::LoraAdapter(d, kv_out, opt.lora));
  if (t.v && v_rows() > 0)
    lora_v = register_module("lora_v", layers::LoraAdapter(d, kv_out, opt.lora));
  if (t.o) lora_o = register_module("lora_o", layers::LoraAdapter(q_out, d, opt.lora));
}

void CausalSelfAttentionImpl::merge_lora() {
  if (latent()) {
    merge_latent_lora();
    return;
  }
  torch::NoGradGuard g;
  const int64_t q_out = q_rows(), kv_out = opt_.kv_heads * opt_.head_dim;
  auto fold = [](layers::LoraAdapter& a, torch::Tensor w) {
    if (!a) return;
    w.add_(a->delta_weight().to(w.scalar_type()));
    a->zero_update();
  };
  fold(lora_q, qkv->weight.narrow(0, 0, q_out));
  fold(lora_k, qkv->weight.narrow(0, q_out, kv_out));
  if (v_rows() > 0) fold(lora_v, qkv->weight.narrow(0, q_out + kv_out, v_rows()));
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
  if (scaling.rotating_pairs > 0 && scaling.rotating_pairs < hd / 2) {
    // Proportional rotary (transformers' _compute_proportional_rope_parameters): the leading
    // pairs' frequencies over the whole head width, then zeros (cos 1, sin 0: no rotation).
    const auto turning = 1.0 / pos_freqs.narrow(0, 0, scaling.rotating_pairs);
    return torch::cat({turning, torch::zeros({hd / 2 - scaling.rotating_pairs}, f32)});
  }
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

torch::Tensor llama_4_query_scale(const torch::Tensor& q, const torch::Tensor& positions,
                                  const config::RopeScalingConfig& scaling) {
  if (scaling.llama_4_scaling_beta <= 0 || scaling.original_max_position_embeddings <= 0) {
    return {};
  }
  const int64_t S = q.size(-2);
  const auto pos = positions.defined()
                       ? positions.to(torch::kFloat)
                       : torch::arange(S, q.options().dtype(torch::kFloat)).unsqueeze(0);
  const auto scale =
      (pos / static_cast<double>(scaling.original_max_position_embeddings)).floor().add(1).log();
  return scale.mul(scaling.llama_4_scaling_beta).add(1).unsqueeze(1).unsqueeze(-1);
}

torch::Tensor pairs_as_halves(const torch::Tensor& x) {
  const int64_t rd = x.size(-1);
  return x.unflatten(-1, {rd / 2, 2}).transpose(-1, -2).flatten(-2);
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

torch::Tensor CausalSelfAttentionImpl::project_qkv(const torch::Tensor& x) {
  const int64_t B = x.size(0), S = x.size(1), KV = opt_.kv_heads, hd = opt_.head_dim;
  const int64_t q_out = q_rows();  // H hd, or 2 H hd with the output gate
  const int64_t v_out = v_rows();  // 0 where the keys are the values
  auto proj = qkv_4bit ? layers::linear_4bit(x, qkv_4bit, qkv->bias)
                       : qkv->forward(x);  // [B, S, q_out + 2 KV hd]
  if (lora_q || lora_k || lora_v) {        // each adapter's update on its rows of the fused output
    auto update = [&](layers::LoraAdapter& a, int64_t width) {
      return a ? a->forward(x) : torch::zeros({B, S, width}, proj.options());
    };
    proj = proj +
           torch::cat({update(lora_q, q_out), update(lora_k, KV * hd), update(lora_v, v_out)}, -1)
               .to(proj.scalar_type());
  }
  return proj;
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  if (latent()) return forward_latent(x);
  const int64_t B = x.size(0), S = x.size(1);
  const int64_t H = opt_.heads, KV = opt_.kv_heads, hd = opt_.head_dim;
  // Views of [B, S, n, hd] as [B, n, S, hd] (the strides of a plain multi-head split). One
  // split, not three narrows: split's backward is one cat of the three gradients; each narrow's
  // backward zero-fills a whole projection-sized gradient and the engine adds the three.
  const auto parts = project_qkv(x).split_with_sizes({q_rows(), KV * hd, v_rows()}, -1);
  // Gemma 4's full-attention layers: the values are the keys' projection, before norm and rotary.
  auto q = parts[0], k = parts[1], v = opt_.keys_are_values ? parts[1] : parts[2];
  torch::Tensor gate;  // gated attention: per head, the query's hd rows and then the gate's
  if (opt_.output_gate) {
    const auto halves = q.view({B, S, H, 2 * hd}).chunk(2, -1);
    q = halves[0], gate = halves[1].reshape({B, S, H * hd});
  }
  if (opt_.qk_norm && opt_.qk_norm_full) {  // OLMoE: over the whole projection
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.reshape({B, S, H, hd}), k = k.reshape({B, S, KV, hd}), v = v.reshape({B, S, KV, hd});
  if (opt_.value_norm) v = at::rms_norm(v, {hd}, {}, opt_.norm_eps);  // Gemma 4's v_norm
  if (opt_.qk_norm && !opt_.qk_norm_full) {                           // Qwen3-MoE: per head
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
    if (opt_.rope_interleave) q = pairs_as_halves(q), k = pairs_as_halves(k);  // ERNIE 4.5
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
  const AttendedKeys keys = attend(k, v);
  k = keys.k, v = keys.v;
  if (KV != H) {  // each key/value head serves H / KV query heads
    k = k.repeat_interleave(H / KV, 1);
    v = v.repeat_interleave(H / KV, 1);
  }
  const double p = is_training() ? opt_.dropout : 0.0;
  AttentionMasking masking{doc_mask_, opt_.window, sinks};
  masking.scale = opt_.softmax_scale;  // 0: 1 / sqrt(hd); Gemma 4: 1
  masking.cached = keys.mask;
  // Sinks on the CPU (or moe.kernels = reference): transformers' eager attention, exactly;
  // elsewhere SDPA, which never forms the [B, H, S, S] scores (attention_core.h).
  auto y = sinks.defined() && !(opt_.fused_attention && q.is_cuda())
               ? attention_reference(q, k, v, masking, p)
               : attention_sdpa(q, k, v, masking, p);
  auto heads = y.transpose(1, 2).reshape({B, S, H * hd});
  if (gate.defined()) heads = heads * torch::sigmoid(gate);
  const auto base =
      out_4bit ? layers::linear_4bit(heads, out_4bit, out->bias) : out->forward(heads);
  return lora_o ? base + lora_o->forward(heads) : base;
}

AttendedKeys CausalSelfAttentionImpl::attend(const torch::Tensor& k, const torch::Tensor& v) {
  if (cache_ == nullptr) return {k, v, {}};
  return attend_cached(*cache_, *step_, k, v, opt_.window);
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

// The attention kinds behind the token-mixer interface.
class AttentionMixer final : public TokenMixer {
 public:
  explicit AttentionMixer(CausalSelfAttention attn) : attn_(std::move(attn)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return attn_->forward(x); }
  void set_documents(const torch::Tensor& mask, const torch::Tensor& positions) override {
    attn_->set_documents(mask, positions);
  }
  void share_rotary_tables(std::shared_ptr<RotaryTableCache> cache) override {
    attn_->share_rotary_tables(std::move(cache));
  }
  void merge_lora() override { attn_->merge_lora(); }
  void set_decode(const DecodeStep* step, LayerCache* cache) override {
    attn_->set_decode(step, cache);
  }

 private:
  CausalSelfAttention attn_;
};

}  // namespace

std::shared_ptr<TokenMixer> attention_mixer(BlockImpl& block, const BlockContext& ctx,
                                            const LayerSpec& spec) {
  const auto& cfg = ctx.cfg;
  const auto& m = cfg.model;
  AttentionOptions a;
  a.hidden = m.hidden_size;
  a.heads = m.num_heads;
  // Full-attention layers may have their own shape and rotary (Gemma 4: model.global_*).
  const bool global = config::global_attention_layer(cfg, ctx.layer);
  a.kv_heads = config::layer_key_value_heads(cfg, ctx.layer);
  a.head_dim = config::layer_head_dim(cfg, ctx.layer);
  a.rope_theta = global && m.global_rope_theta > 0 ? m.global_rope_theta : m.rope_theta;
  a.rope_scaling = m.rope_scaling;
  if (global && m.global_partial_rotary_factor < 1.0) {  // transformers' int(factor * hd // 2)
    a.rope_scaling.rotating_pairs = static_cast<int64_t>(
        std::floor(m.global_partial_rotary_factor * static_cast<double>(a.head_dim) / 2.0));
  }
  a.keys_are_values = config::keys_are_values(cfg, ctx.layer);
  a.value_norm = m.value_norm;
  a.qk_norm = m.qk_norm;
  a.qk_norm_full = m.qk_norm_scope == config::QkNormScope::kFull;
  a.clip_qkv = m.clip_qkv;
  a.bias = m.attention_bias;
  a.qkv_bias = m.qkv_bias;
  // transformers' int(head_dim * partial_rotary_factor) (validated: even, >= 2)
  a.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * m.partial_rotary_factor);
  a.sinks = m.attention_sinks;
  a.output_gate = m.attention_output_gate;
  a.zero_centered_norm = m.zero_centered_norm;
  a.window = spec.attention_window;
  a.norm_eps = m.norm_eps;
  a.dropout = m.dropout;
  a.init_std = m.init_std;
  a.out_init_std = output_init_std(cfg);
  a.lora = lora_spec(cfg);
  a.lora_targets = config::lora_targets(cfg.lora);
  a.fused_rotary = fused_block_kernels(ctx);
  a.fused_attention = a.fused_rotary;
  // Latent attention (spec.mixer kLatentAttention) is kv_lora_rank > 0 (layer_spec's rule).
  a.kv_lora_rank = m.kv_lora_rank;
  a.q_lora_rank = m.q_lora_rank;
  a.qk_nope_head_dim = m.qk_nope_head_dim;
  a.qk_rope_head_dim = m.qk_rope_head_dim;
  a.v_head_dim = m.v_head_dim;
  a.rope_interleave = m.rope_interleave;
  a.softmax_scale = m.attention_scale > 0 ? m.attention_scale : latent_softmax_scale(cfg);
  block.attn = block.register_module("attn", CausalSelfAttention(a));
  return std::make_shared<AttentionMixer>(block.attn);
}

}  // namespace moe::model
