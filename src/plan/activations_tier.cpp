// The activations tier: what autograd keeps for the backward of one micro-batch (attention,
// router, dispatched rows, expert intermediates, head), as configured and with and without
// activation checkpointing, walked through the backward pass layer by layer to find its peak
// with the backward's transients and the gradients produced so far (docs/memory.md).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe/config/lora.h"
#include "plan_parts.h"

namespace moe::plan {

using config::dense_hidden_size;
using config::expert_hidden_size;
using config::head_dim;
using config::is_moe_layer;
using config::key_value_heads;
using config::latent_attention;
using config::lora_enabled;
using config::qk_head_dim;
using config::saved_in_full;

// Whether our CUDA kernels run (the fused SwiGLU, the 8-bit AdamW step): a GPU run, a build that
// has them, and moe.kernels not `reference` (the model's own rule).
bool fused_kernels(const Config& c, const PlanOptions& opt) {
  return !opt.cpu && opt.cuda_kernels && c.moe.kernels != config::MoeKernels::kReference;
}

Shape shape_of(const Config& c, int64_t micro_batch, const PlanOptions& opt) {
  const bool cpu = opt.cpu;
  Shape s{};
  s.T = static_cast<double>(micro_batch * c.model.seq_len);
  s.d = static_cast<double>(c.model.hidden_size);
  s.H = static_cast<double>(c.model.num_heads);
  s.KV = static_cast<double>(key_value_heads(c));
  s.hd = static_cast<double>(head_dim(c));
  s.E = static_cast<double>(c.moe.num_experts);
  s.k = static_cast<double>(c.moe.top_k);
  s.f = static_cast<double>(expert_hidden_size(c));
  s.fd = static_cast<double>(dense_hidden_size(c));
  s.V = static_cast<double>(c.model.vocab_size);
  s.fs = static_cast<double>(c.moe.shared_expert_hidden_size);
  s.de = static_cast<double>(config::expert_model_size(c));
  s.a =
      ((!cpu && (c.bf16.enabled || c.fp16.enabled)) || c.training.param_dtype != ParamDtype::kFp32)
          ? 2.0
          : 4.0;
  // relu2 MLPs keep relu(up) (relu's backward reads its output, the square's its input) and the
  // square (down's input).
  s.swiglu_kept = !config::gated_mlp(c) ? 2.0 : fused_kernels(c, opt) ? 3.0 : 4.0;
  s.checkpoints_on_host = !cpu && c.activation_checkpointing.cpu_checkpointing;
  return s;
}

namespace {

// What autograd keeps for the backward of one block, per its own ops (src/model/transformer.cpp,
// src/moe/*.cpp), in bytes: the block input (saved by the first RMSNorm) and every tensor a later
// op's backward reads. Views (q, k, v of the fused projection) share their base's storage.
// Multi-head latent attention (model/latent_attention.cpp): the projections' outputs through
// the two bottlenecks and their norms, the rotary part, q and k joined, the attention output.
double latent_attention_saved(const Config& c, const Shape& s) {
  const auto& m = c.model;
  const double T = s.T, a = s.a, H = s.H;
  const double qk = static_cast<double>(qk_head_dim(c)), v = static_cast<double>(m.v_head_dim);
  const double qr = static_cast<double>(m.q_lora_rank), kvr = static_cast<double>(m.kv_lora_rank);
  const double rope = static_cast<double>(m.qk_rope_head_dim);
  double b = T * s.d * a + T * 4 + T * s.d * a;     // block input + rstd, normalised input
  if (qr > 0) b += 2 * T * qr * a + T * 4;          // q_a's output (norm input), rstd, normed
  b += T * H * qk * a;                              // q (q_proj / q_b_proj output)
  b += T * (kvr + rope) * a + T * 4 + T * kvr * a;  // kv_a's output, rstd, normed latent
  b += T * H * (qk - rope + v) * a;                 // kv_b's output: k_nope | v
  b += 2 * T * (H + 1) * rope * a;                  // the rotary parts, rotated
  b += 2 * T * H * qk * a;                          // q and k joined (the attention's inputs)
  b += T * H * v * a + T * H * 4;                   // attention output + logsumexp
  b += T * H * v * a;                               // its [T, H v] copy (output projection input)
  b += lora_latent_attention_saved(c, s);           // each adapter's x A [T, r]
  return b;
}

// Gated DeltaNet (model/gated_deltanet.cpp) as its ATen reference runs (gated_delta_rule.cpp):
// the projections, the conv's taps, the rule's fp32 copies of q, k, v (keys repeated to every
// value head) and its per-chunk [64, 64] matrices and states, the gated norm.
struct LinearShape {
  double kd, vd, conv, nv, dk, dv, K;
};
LinearShape linear_shape(const Config& c) {
  const auto& m = c.model;
  LinearShape l{};
  l.nv = static_cast<double>(m.linear_num_value_heads);
  l.dk = static_cast<double>(m.linear_key_head_dim);
  l.dv = static_cast<double>(m.linear_value_head_dim);
  l.kd = static_cast<double>(m.linear_num_key_heads) * l.dk;
  l.vd = l.nv * l.dv;
  l.conv = 2 * l.kd + l.vd;
  l.K = static_cast<double>(m.linear_conv_kernel_dim);
  return l;
}

double linear_attention_saved(const Config& c, const Shape& s) {
  const LinearShape l = linear_shape(c);
  const double T = s.T, a = s.a, C = 64;
  double b = 0;
  b += 2 * T * s.d * a + T * 4;               // block input + rstd, normalised input
  b += T * (l.conv + l.vd + 2 * l.nv) * a;    // q|k|v, z, b, a projections
  b += (l.K + 1) * T * l.conv * a;            // the conv's shifted taps, its pre-SiLU sum
  b += 4 * T * l.nv * (4 * l.dk + 3 * l.dv);  // fp32 q, k (per value head), normed, v, betas
  b += 3 * T * C * l.nv * 4;                  // per-chunk decays, K K^T, Q K^T
  b += 4 * T * l.nv * (2 * l.dk + 2 * l.dv);  // the solves' outputs, decayed q and k, v_new
  b += 2 * (T / C) * l.nv * l.dk * l.dv * 4;  // each chunk's state, twice
  b += 3 * T * l.vd * 4 + T * l.vd * a;       // gated norm, out_proj's input
  return b;
}

// Mamba-2 (model/mamba2_mixer.cpp) as its ATen reference runs (mamba2_scan.cpp): the in_proj
// output, the conv's taps and SiLU, the scan's fp32 copies (B and C repeated to every head), its
// per-chunk [Q, Q] matrices and states, the gated norm, out_proj's input.
double mamba_saved(const Config& c, const Shape& s) {
  const auto& m = c.model;
  const double T = s.T, a = s.a, Q = static_cast<double>(m.mamba_chunk_size);
  const double H = static_cast<double>(m.mamba_num_heads),
               N = static_cast<double>(m.ssm_state_size);
  const double P = static_cast<double>(m.mamba_head_dim), inner = H * P;
  const double conv = static_cast<double>(config::mamba_conv_channels(c));
  const double K = static_cast<double>(m.mamba_conv_kernel);
  double b = 0;
  b += 2 * T * s.d * a + T * 4;          // block input + rstd, normalised input
  b += T * (inner + conv + H) * a;       // z | x, B, C | dt
  b += K * T * conv * a;                 // the conv's K - 1 shifted taps, its sum (SiLU's input)
  b += 4 * T * (2 * inner + 3 * H * N);  // fp32 x, x dt; B, C and the decayed C per head
  b += 4 * T * H * 4;                    // dt (softplus input and output), dt A, its cumsum
  b += 3 * T * Q * H * 4;                // per chunk C B^T, its decay, their product
  b += 2 * (T / Q) * H * P * N * 4;      // each chunk's state, twice
  b += 6 * T * inner * 4;                // y, silu(z)'s in and out, gated, normed, x weight
  return b;
}

// The block's shape at layer `layer`: full-attention layers may have their own head width and
// key/value heads (Gemma 4's model.global_*).
Shape layer_shape(const Config& c, const Shape& s, int64_t layer) {
  Shape l = s;
  l.hd = static_cast<double>(config::layer_head_dim(c, layer));
  l.KV = static_cast<double>(config::layer_key_value_heads(c, layer));
  return l;
}

double attention_saved(const Config& c, const Shape& shape, int64_t layer) {
  if (!config::has_mixer(c, layer)) return 0;  // a feed-forward-only block
  if (config::linear_attention_layer(c, layer)) return linear_attention_saved(c, shape);
  if (config::mamba_layer(c, layer)) return mamba_saved(c, shape);
  if (latent_attention(c)) return latent_attention_saved(c, shape);
  const Shape s = layer_shape(c, shape, layer);
  const double T = s.T, a = s.a;
  const bool gqa = s.KV != s.H, rope = c.model.rope_theta > 0;
  const double v_heads = config::keys_are_values(c, layer) ? 0 : s.KV;  // K = V: no v rows
  double b = 0;
  b += T * s.d * a + T * 4;                    // block input (RMSNorm input) + rstd
  b += T * s.d * a;                            // normalised input (qkv projection's input)
  b += T * (s.H + s.KV + v_heads) * s.hd * a;  // fused q|k|v projection (q, k, v are views)
  if (c.model.value_norm) b += T * s.KV * s.hd * a + T * s.KV * 4;  // normed v, its rstd
  if (c.model.sandwich_norms) b += T * s.d * a + T * 4;            // the output's norm: input, rstd
  if (c.model.attention_output_gate) b += 3 * T * s.H * s.hd * a;  // gate rows, sigmoid, product
  if (c.model.qk_norm) b += T * (s.H + s.KV) * s.hd * a + T * (s.H + s.KV) * 4;  // normed q, k
  if (rope) b += 2 * T * (s.H + s.KV) * s.hd * a;  // rotate_half(q|k) and the rotated q|k
  if (gqa) b += 2 * T * s.H * s.hd * a;            // k, v repeated to every query head
  b += T * s.H * s.hd * a + T * s.H * 4;           // attention output + logsumexp
  b += T * s.H * s.hd * a;                         // its [T, H hd] copy (output projection input)
  return b + lora_attention_saved(c, s);
}

// Gemma 4's block beyond the feed-forward (moe.parallel_dense, model.sandwich_norms): the dense
// MLP beside the experts with its norms (its input is the residual the experts' norm keeps),
// the router's own norm of the residual in fp32, the branches' and the sum's output norms.
double parallel_block_saved(const Config& c, const Shape& s, bool moe_layer) {
  const double T = s.T, a = s.a;
  double b = 0;
  if (c.model.sandwich_norms) b += T * s.d * a + T * 4;  // the feed-forward output's norm
  if (!(moe_layer && c.moe.parallel_dense)) return b;
  const bool lora = lora_enabled(c);
  const config::LoraTargets t = lora ? config::lora_targets(c.lora) : config::LoraTargets{};
  b += T * 4 + T * s.d * a;  // the dense MLP's rstd and normed input
  b += (s.swiglu_kept - (!lora || t.dense_mlp ? 0 : 1)) * T * s.fd * a;  // its GLU
  b += 2 * (T * s.d * a + T * 4);  // the two branches' output norms: inputs, rstd
  if (c.moe.router_input_norm) b += 3 * T * s.d * 4;  // the residual normed, scaled (fp32)
  return b;
}

double ffn_saved(const Config& c, const Shape& s, bool moe_layer) {
  const double T = s.T, a = s.a;
  double b = T * s.d * a + T * 4 + T * s.d * a;  // residual (RMSNorm input), rstd, normalised
  b += lora_ffn_saved(c, s, moe_layer) + parallel_block_saved(c, s, moe_layer);
  // LoRA: a frozen projection keeps nothing of its own (lora_attention_saved), so the rows
  // dispatched to the experts (gate and up's input) stay only for an adapter on gate/up, and the
  // SwiGLU product (down's input) only for one on down.
  const bool lora = lora_enabled(c);
  const config::LoraTargets t = lora ? config::lora_targets(c.lora) : config::LoraTargets{};
  if (!moe_layer) {  // gate, (silu,) up, product
    return b + (s.swiglu_kept - (!lora || t.dense_mlp ? 0 : 1)) * T * s.fd * a;
  }
  const bool up_adapter = config::gated_mlp(c) ? t.experts_gate_up_rank > 0 : t.experts_up;
  const bool rows_kept = !lora || up_adapter;
  const double product = !lora || t.experts_down ? 0 : 1;  // 1: the product is not kept
  b += 3 * T * s.E * 4;  // router logits, probabilities, z-loss terms
  b += T * s.k * ((rows_kept ? s.de * a : 0) + 3 * 8);  // dispatched rows + plan indices
  b += (s.swiglu_kept - product) * T * s.k * s.f * a;   // gate, (silu(gate),) up, product per row
  b += T * s.k * s.de * a;                              // expert outputs (the combine's input)
  if (c.moe.latent_size > 0) b += 2 * T * s.de * a;     // LatentMoE: latent rows, combined output
  if (s.fs > 0) b += s.swiglu_kept * T * s.fs * a;      // shared expert
  return b;
}

// The head: final norm input and output, logits and their fp32 log-softmax.
double head_saved(const Config& c, const Shape& s) {
  // Soft-capped logits (model.final_logit_softcapping): tanh's output too.
  const double capped = c.model.final_logit_softcapping > 0 ? s.T * s.V * s.a : 0;
  return 2 * s.T * s.d * s.a + s.T * 4 + s.T * s.V * s.a + s.T * s.V * 4 * (s.a < 4 ? 2 : 1) +
         capped;
}

// The largest buffers alive only during one block's backward: the gradients flowing through
// the widest intermediate (expert rows x f, twice) or the attention's inputs.
double block_transient(const Config& c, const Shape& shape, int64_t layer) {
  const Shape s = layer_shape(c, shape, layer);
  const bool moe_layer = is_moe_layer(c, layer);
  const double ffn = !config::has_feed_forward(c, layer) ? 0
                     : moe_layer ? 2 * s.T * s.k * s.f * s.a + 2 * s.T * s.k * s.de * s.a
                                 : 2 * s.T * s.fd * s.a;
  if (!config::has_mixer(c, layer)) return ffn;
  if (config::mamba_layer(c, layer)) {  // the fp32 gradients of the scan's inputs and output
    const double inner = static_cast<double>(config::mamba_inner_size(c));
    return std::max(ffn, 3 * s.T * inner * 4 +
                             2 * s.T * static_cast<double>(config::mamba_conv_channels(c)) * s.a);
  }
  if (config::linear_attention_layer(c, layer)) {  // the fp32 gradients of the rule's inputs
    const LinearShape l = linear_shape(c);
    return std::max(ffn, 3 * s.T * l.nv * (l.dk + l.dv) * 4 + 2 * s.T * l.conv * s.a);
  }
  const double attn = latent_attention(c) ? 3 * s.T * s.H *
                                                (2 * static_cast<double>(qk_head_dim(c)) +
                                                 static_cast<double>(c.model.v_head_dim)) *
                                                s.a
                                          : 3 * s.T * (s.H + 2 * s.KV) * s.hd * s.a;
  return std::max(ffn, attn);
}

struct Walk {
  double activations = 0, transient = 0, peak_dynamic = 0;
  double host = 0;  // checkpointed inputs held in host memory (cpu_checkpointing)
};

// The backward pass, head first, block by block: what is alive at each point is the static
// state, the activations of the blocks not yet processed, that block's transient buffers and the
// gradients produced so far (all of them from the second micro-batch of an accumulation on).
Walk walk_backward(const Config& c, const Shape& s, bool checkpoint_all,
                   double grad_bytes_per_param, bool grads_preexist) {
  const int64_t L = c.model.num_layers;
  const double ckpt_layers =
      checkpoint_all
          ? static_cast<double>(L)
          : static_cast<double>(std::min(c.activation_checkpointing.number_checkpoints, L));
  std::vector<double> kept(static_cast<size_t>(L)), full(static_cast<size_t>(L));
  double acts = 0, host = 0;
  for (int64_t l = 0; l < L; ++l) {
    full[l] = attention_saved(c, s, l) +
              (config::has_feed_forward(c, l) ? ffn_saved(c, s, is_moe_layer(c, l)) : 0);
    const bool checkpointed = static_cast<double>(l) < ckpt_layers;
    // A checkpointed block keeps its input only: on the device, or in host memory until its
    // backward copies it back (counted in full[l], the recomputed block's own input).
    kept[l] = checkpointed ? (s.checkpoints_on_host ? 0 : s.T * s.d * s.a) : full[l];
    if (checkpointed && s.checkpoints_on_host) host += s.T * s.d * s.a;
    acts += kept[l];
  }
  // A frozen head (LoRA) does not keep its input for a weight gradient.
  const bool tied = c.model.tie_embeddings;
  const bool frozen_head =
      lora_enabled(c) && !saved_in_full(c.lora, tied ? "embed.weight" : "lm_head.weight", tied);
  double head = head_saved(c, s) - (frozen_head ? s.T * s.d * s.a : 0);
  // Head backward: the gradient of the fp32 log-softmax and of the logits.
  double head_transient = 2 * s.T * s.V * 4;
  if (c.training.head_chunk_tokens > 0) {
    // Chunked (train/chunked_lm_loss.h): no logits kept; the norm's input and statistics stay,
    // with the gradients the forward computed (hidden states fp32, the head's weight fp32 unless
    // frozen). Transient: one chunk's fp32 logits (softmax in place) with its 16-bit product and
    // gradient, the 16-bit copy of the weight; in the backward, the scaled copies of both
    // gradients.
    const double rows = std::min(static_cast<double>(c.training.head_chunk_tokens), s.T);
    const double weight_grad = frozen_head ? 0 : s.V * s.d * 4;
    head = s.T * s.d * s.a + s.T * 4 + s.T * s.d * 4 + weight_grad;
    // ... and each chunk's weight-gradient product [V, d] (fp32 under fp16) before its add.
    const double product = frozen_head ? 0 : s.V * s.d * (c.fp16.enabled ? 4 : s.a);
    // The weight's 16-bit copy exists only for an fp32 one: a frozen head under mixed precision
    // (LoRA's 16-bit base) or 16-bit working weights are already in the compute dtype.
    const bool weight_16bit = frozen_head || c.training.param_dtype != ParamDtype::kFp32;
    const double forward = rows * s.V * (4 + (s.a < 4 ? 2 * s.a : 4)) +
                           (s.a < 4 && !weight_16bit ? s.V * s.d * s.a : 0) + product;
    head_transient = std::max(forward, s.T * s.d * 4 + weight_grad);
  }
  Walk w;
  w.host = host;
  w.activations = acts + head;
  // The head's own gradients (untied head, final norm) come first in the backward.
  const double head_params =
      static_cast<double>((c.model.tie_embeddings ? 0 : c.model.vocab_size * c.model.hidden_size) +
                          c.model.hidden_size);
  double grads =
      grads_preexist ? static_cast<double>(config::count_parameters(c)) * grad_bytes_per_param : 0;
  double peak = acts + head + head_transient;
  w.transient = head_transient;
  if (!grads_preexist) grads += head_params * grad_bytes_per_param;
  for (int64_t l = L - 1; l >= 0; --l) {
    // A checkpointed block first recomputes its activations.
    const double live_block = full[l] + block_transient(c, s, l);
    const double before = acts - kept[l];
    peak = std::max(peak, before + live_block + grads + s.T * s.d * s.a);
    w.transient = std::max(w.transient, block_transient(c, s, l));
    acts = before;
    if (!grads_preexist)
      grads += static_cast<double>(config::layer_parameters(c, l)) * grad_bytes_per_param;
  }
  w.peak_dynamic = peak;
  return w;
}

}  // namespace

// The activations one micro-batch keeps (as configured, with and without checkpointing), the
// backward's transients, and the peak of the backward for the plan's peak. Gradients (fp32).
// Data parallel (docs/distributed.md): ZeRO-2 with overlap_comm reduces each gradient onto its
// owner during the backward and releases the others as it goes, so a rank holds its share (4/N
// bytes per parameter, accumulating as the backward proceeds) plus the bucket being filled and at
// most two in flight. Otherwise every gradient exists in the backward; ZeRO-2 without the overlap
// releases the foreign ones before the update. DDP's Reducer (stages 0-1 with the overlap) keeps
// its buckets, a second copy of every gradient.
void add_activations(const PlanContext& x, PlanDraft& d) {
  const Config& c = x.c;
  const PlanBasis& b = x.b;
  MemoryPlan& p = d.plan;
  // The backward walk spreads gradients over the layers' parameters: scale them to the share
  // that trains.
  const bool partitioned = b.dp.reduction == GradientReduction::kReduceToOwnersInBackward;
  const double grad_bytes = !b.w16 ? 4 : b.fp32_sums && b.accumulate ? 6 : 2;  // in a backward
  const double grad_per_param = (partitioned ? grad_bytes / b.N : grad_bytes) * b.trained / b.P;
  const Shape s = shape_of(c, p.micro_batch, x.opt);
  const bool ckpt = x.opt.checkpointing;
  const Walk as_configured = walk_backward(c, s, ckpt, grad_per_param, b.accumulate);
  p.activations = as_configured.activations;
  Config no_checkpoint = c;
  no_checkpoint.activation_checkpointing.number_checkpoints = 0;
  p.activations_no_checkpoint =
      walk_backward(no_checkpoint, s, false, grad_per_param, false).activations;
  p.activations_checkpoint = walk_backward(c, s, true, grad_per_param, false).activations;
  p.backward_transient = as_configured.transient;
  p.host += as_configured.host;  // checkpointed inputs waiting on the host
  d.backward_peak = as_configured.peak_dynamic;
}

}  // namespace moe::plan
