#include "moe/config/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>

#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "moe/util/errors.h"

namespace moe::config {

namespace {

// Values of the largest parameter the optimizer updates (a LoRA run: the largest adapter).
double largest_trained_parameter(const Config& c) {
  double largest = 0;
  for (const auto& p : model::parameter_layout(c)) {
    if (lora_enabled(c) && p.name.find("lora_") == std::string::npos) continue;
    double n = 1;
    for (int64_t d : p.shape) n *= static_cast<double>(d);
    largest = std::max(largest, n);
  }
  return largest;
}

// Values of the routed experts' stacks (all MoE layers), which expert parallelism spreads.
double routed_expert_parameters(const Config& c) {
  double n = 0;
  for (const auto& p : model::parameter_layout(c)) {
    if (p.name.find(".moe.experts.") == std::string::npos) continue;
    double v = 1;
    for (int64_t d : p.shape) v *= static_cast<double>(d);
    n += v;
  }
  return n;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Shape {
  double T, d, H, KV, hd, E, k, f, fd, V, fs;
  double a;  // bytes of an activation element (2 under bf16/fp16 autocast on a GPU, else 4)
  // silu(gate) * up kept per FFN row: 3 (gate, up, the product) with the fused kernel
  // (kernels/swiglu.h: silu(gate) recomputed in the backward), 4 with ATen's two ops.
  double swiglu_kept;
  // activation_checkpointing.cpu_checkpointing on a GPU: checkpointed inputs wait on the host.
  bool checkpoints_on_host = false;
};

// Whether our CUDA kernels run (the fused SwiGLU, the 8-bit AdamW step): a GPU run, a build that
// has them, and moe.kernels not `reference` (the model's own rule).
bool fused_kernels(const Config& c, const PlanOptions& opt) {
  return !opt.cpu && opt.cuda_kernels && c.moe.kernels != MoeKernels::kReference;
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
  s.a =
      ((!cpu && (c.bf16.enabled || c.fp16.enabled)) || c.training.param_dtype != ParamDtype::kFp32)
          ? 2.0
          : 4.0;
  s.swiglu_kept = fused_kernels(c, opt) ? 3.0 : 4.0;
  s.checkpoints_on_host = !cpu && c.activation_checkpointing.cpu_checkpointing;
  return s;
}

// LoRA: autograd keeps a GEMM's input only for its weight's gradient, so a frozen projection
// keeps nothing of its own; each adapter keeps its input (the base GEMM's, once) and x A
// [rows, r] for B's gradient. Dropout on the adapters' inputs adds the dropped copy.
double lora_attention_saved(const Config& c, const Shape& s) {
  if (!lora_enabled(c)) return 0;
  const LoraTargets t = lora_targets(c.lora);
  const double r = static_cast<double>(c.lora.r);
  const double qkv = (t.q ? 1 : 0) + (t.k ? 1 : 0) + (t.v ? 1 : 0);
  double b = (qkv + (t.o ? 1 : 0)) * s.T * r * s.a;
  if (!t.o) b -= s.T * s.H * s.hd * s.a;  // the output projection's input is not kept
  if (c.lora.lora_dropout > 0) b += s.T * (s.d * (qkv > 0 ? 1 : 0) + (t.o ? s.H * s.hd : 0)) * s.a;
  return b;
}

double lora_ffn_saved(const Config& c, const Shape& s, bool moe_layer) {
  if (!lora_enabled(c)) return 0;
  const LoraTargets t = lora_targets(c.lora);
  const double r = static_cast<double>(c.lora.r);
  if (!moe_layer) return t.dense_mlp ? 3 * s.T * r * s.a : 0;
  const double rows = s.T * s.k;
  return rows * (static_cast<double>(t.experts_gate_up_rank) + (t.experts_down ? r : 0)) * s.a;
}

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
  if (lora_enabled(c)) {                            // each adapter's x A [T, r]
    const LoraTargets t = lora_targets(c.lora);
    const int64_t n =
        (t.q && qr == 0) + (t.q_a && qr > 0) + (t.q_b && qr > 0) + t.kv_a + t.kv_b + t.o;
    b += static_cast<double>(n) * T * static_cast<double>(c.lora.r) * a;
  }
  return b;
}

double attention_saved(const Config& c, const Shape& s) {
  if (latent_attention(c)) return latent_attention_saved(c, s);
  const double T = s.T, a = s.a;
  const bool gqa = s.KV != s.H, rope = c.model.rope_theta > 0;
  double b = 0;
  b += T * s.d * a + T * 4;              // block input (RMSNorm input) + rstd
  b += T * s.d * a;                      // normalised input (qkv projection's input)
  b += T * (s.H + 2 * s.KV) * s.hd * a;  // fused q|k|v projection (q, k, v are views)
  if (c.model.qk_norm) b += T * (s.H + s.KV) * s.hd * a + T * (s.H + s.KV) * 4;  // normed q, k
  if (rope) b += 2 * T * (s.H + s.KV) * s.hd * a;  // rotate_half(q|k) and the rotated q|k
  if (gqa) b += 2 * T * s.H * s.hd * a;            // k, v repeated to every query head
  b += T * s.H * s.hd * a + T * s.H * 4;           // attention output + logsumexp
  b += T * s.H * s.hd * a;                         // its [T, H hd] copy (output projection input)
  return b + lora_attention_saved(c, s);
}

double ffn_saved(const Config& c, const Shape& s, bool moe_layer) {
  const double T = s.T, a = s.a;
  double b = T * s.d * a + T * 4 + T * s.d * a;  // residual (RMSNorm input), rstd, normalised
  b += lora_ffn_saved(c, s, moe_layer);
  // LoRA: a frozen projection keeps nothing of its own (lora_attention_saved), so the rows
  // dispatched to the experts (gate and up's input) stay only for an adapter on gate/up, and the
  // SwiGLU product (down's input) only for one on down.
  const bool lora = lora_enabled(c);
  const LoraTargets t = lora ? lora_targets(c.lora) : LoraTargets{};
  if (!moe_layer) {  // gate, (silu,) up, product
    return b + (s.swiglu_kept - (!lora || t.dense_mlp ? 0 : 1)) * T * s.fd * a;
  }
  const bool rows_kept = !lora || t.experts_gate_up_rank > 0;
  const double product = !lora || t.experts_down ? 0 : 1;  // 1: the product is not kept
  b += 3 * T * s.E * 4;                                // router logits, probabilities, z-loss terms
  b += T * s.k * ((rows_kept ? s.d * a : 0) + 3 * 8);  // dispatched rows + plan indices
  b += (s.swiglu_kept - product) * T * s.k * s.f * a;  // gate, (silu(gate),) up, product per row
  b += T * s.k * s.d * a;                              // expert outputs (the combine's input)
  if (s.fs > 0) b += s.swiglu_kept * T * s.fs * a;     // shared expert
  return b;
}

// The head: final norm input and output, logits and their fp32 log-softmax.
double head_saved(const Shape& s) {
  return 2 * s.T * s.d * s.a + s.T * 4 + s.T * s.V * s.a + s.T * s.V * 4 * (s.a < 4 ? 2 : 1);
}

// The largest buffers alive only during one block's backward: the gradients flowing through
// the widest intermediate (expert rows x f, twice) or the attention's inputs.
double block_transient(const Config& c, const Shape& s, bool moe_layer) {
  const double ffn =
      moe_layer ? 2 * s.T * s.k * s.f * s.a + 2 * s.T * s.k * s.d * s.a : 2 * s.T * s.fd * s.a;
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
    full[l] = attention_saved(c, s) + ffn_saved(c, s, is_moe_layer(c, l));
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
  double head = head_saved(s) - (frozen_head ? s.T * s.d * s.a : 0);
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
      grads_preexist ? static_cast<double>(count_parameters(c)) * grad_bytes_per_param : 0;
  double peak = acts + head + head_transient;
  w.transient = head_transient;
  if (!grads_preexist) grads += head_params * grad_bytes_per_param;
  for (int64_t l = L - 1; l >= 0; --l) {
    // A checkpointed block first recomputes its activations.
    const double live_block = full[l] + block_transient(c, s, is_moe_layer(c, l));
    const double before = acts - kept[l];
    peak = std::max(peak, before + live_block + grads + s.T * s.d * s.a);
    w.transient = std::max(w.transient, block_transient(c, s, is_moe_layer(c, l)));
    acts = before;
    if (!grads_preexist)
      grads += static_cast<double>(layer_parameters(c, l)) * grad_bytes_per_param;
  }
  w.peak_dynamic = peak;
  return w;
}

std::string gib(double bytes) {
  char b[32];
  if (bytes >= kGiB) {
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / kGiB);
  } else {
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return b;
}

}  // namespace

std::vector<MemoryTier> memory_tiers() {
  static const char* kWeights[] = {"fp32 weights", "bf16 weights + fp32 master",
                                   "bf16 weights + bf16 master (Kahan)"};
  static const char* kWeightSettings[] = {
      "", "bf16.enabled=true training.param_dtype=bf16 ",
      "bf16.enabled=true training.param_dtype=bf16 optimizer.main_params_dtype=bf16 "};
  static const char* kMoments[] = {"fp32 moments", "bf16 moments", "8-bit moments"};
  static const char* kMomentSettings[] = {
      "", "optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16 ",
      "optimizer.exp_avg_dtype=8bit optimizer.exp_avg_sq_dtype=8bit "};
  std::vector<MemoryTier> tiers;
  for (int ck = 0; ck < 2; ++ck) {
    // off: 0 none, 1 offload with gradients streamed in the backward, 2 copied after it
    for (int off = 0; off < 3; ++off) {
      for (int m = 0; m < 3; ++m) {
        for (int w = 0; w < 3; ++w) {
          if (w == 2 && off > 0) continue;   // offload keeps an fp32 master on the host
          if (w == 0 && off == 2) continue;  // fp32 gradients: the same bytes either way
          MemoryTier t;
          t.weights = w;
          t.moments = m;
          t.offload = off > 0;
          t.offload_after_backward = off == 2;
          t.checkpointing = ck == 1;
          t.cost = (w == 1 ? 1 : w == 2 ? 2 : 0) + m + (off ? 2 + off : 0) + ck;
          t.name = std::string(kWeights[w]) + ", " + kMoments[m] +
                   (off == 1   ? ", offload"
                    : off == 2 ? ", offload (gradients copied after the backward)"
                               : "") +
                   (ck ? ", checkpointing" : "");
          t.settings = std::string(kWeightSettings[w]) + kMomentSettings[m] +
                       (off ? "zero_optimization.offload_optimizer.device=cpu " : "") +
                       (off == 2 ? "zero_optimization.overlap_comm=false " : "") +
                       (ck ? "activation_checkpointing.number_checkpoints=NUM_LAYERS " : "");
          if (!t.settings.empty()) t.settings.pop_back();
          tiers.push_back(t);
        }
      }
    }
  }
  std::stable_sort(tiers.begin(), tiers.end(),
                   [](const MemoryTier& a, const MemoryTier& b) { return a.cost < b.cost; });
  return tiers;
}

void apply_tier(const MemoryTier& t, Config& c, PlanOptions& o) {
  const ParamDtype sixteen = c.fp16.enabled ? ParamDtype::kFp16 : ParamDtype::kBf16;
  if (t.weights > 0 && !c.fp16.enabled) c.bf16.enabled = true;
  c.training.param_dtype = t.weights > 0 ? sixteen : ParamDtype::kFp32;
  c.optimizer.main_params_dtype = t.weights == 2 ? ParamDtype::kBf16 : ParamDtype::kFp32;
  const StateDtype m = t.moments == 0   ? StateDtype::kFp32
                       : t.moments == 1 ? StateDtype::kBf16
                                        : StateDtype::k8Bit;
  c.optimizer.exp_avg_dtype = c.optimizer.exp_avg_sq_dtype = m;
  c.zero_optimization.offload_optimizer.device =
      t.offload ? OffloadDevice::kCpu : OffloadDevice::kNone;
  if (t.offload) c.zero_optimization.overlap_comm = !t.offload_after_backward;
  o.checkpointing = t.checkpointing;
}

namespace {
bool fits_memory(const MemoryPlan& p, const PlanOptions& opt) {
  return p.reserved <= opt.device_bytes && (opt.host_bytes <= 0 || p.host <= opt.host_bytes);
}
}  // namespace

LargestModel largest_fitting_model(const Config& c, const PlanOptions& opt) {
  LargestModel best;
  auto plan_with = [&](int64_t layers) {
    Config alt = c;
    alt.model.num_layers = layers;
    alt.moe.mlp_only_layers.clear();  // a layer list of the original depth would not apply
    PlanOptions o = opt;
    o.device_bytes = 0;
    return plan_memory(alt, o);
  };
  int64_t lo = 0, hi = 1;
  while (hi <= 65536 && fits_memory(plan_with(hi), opt)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_memory(plan_with(mid), opt) ? lo : hi) = mid;
  }
  if (lo == 0) return best;
  const MemoryPlan p = plan_with(lo);
  best.num_layers = lo;
  best.parameters = p.parameters;
  best.reserved = p.reserved;
  best.host = p.host;
  return best;
}

namespace {

// Plans of altered copies: `change` alters a copy of the config and the options (device_bytes 0:
// no advice of their own), and the plan is judged against the original options' device.
class Trial {
 public:
  Trial(const Config& c, const PlanOptions& opt) : c_(c), opt_(opt) {}

  template <typename Change>
  MemoryPlan plan(Change change) const {
    Config alt = c_;
    PlanOptions o = opt_;
    o.device_bytes = 0;
    change(alt, o);
    return plan_memory(alt, o);
  }
  // Does the plan fit once `change` has altered a copy of the config and the options?
  template <typename Change>
  bool fits(Change change) const {
    return fits_memory(plan(change), opt_);
  }
  // What the altered copy reserves where it fits; 0 where it does not.
  template <typename Change>
  double reserved_if_fits(Change change) const {
    const MemoryPlan q = plan(change);
    return fits_memory(q, opt_) ? q.reserved : 0.0;
  }

 private:
  const Config& c_;
  const PlanOptions& opt_;
};

// The cheapest tier that fits as configured otherwise, with its settings; none when none does.
std::optional<std::string> cheapest_fitting_tier(const Config& c, const Trial& trial) {
  for (const MemoryTier& t : memory_tiers()) {
    if (trial.fits([&](Config& a, PlanOptions& o) { apply_tier(t, a, o); })) {
      std::string settings = t.settings;
      const auto at = settings.find("NUM_LAYERS");
      if (at != std::string::npos) settings.replace(at, 10, std::to_string(c.model.num_layers));
      return t.name + (settings.empty() ? "" : " (" + settings + ")");
    }
  }
  return std::nullopt;
}

// Memory grows with the micro-batch: double to an upper bound, then bisect.
int64_t largest_fitting_micro_batch(const Trial& trial) {
  auto fits_with = [&](int64_t b) {
    return trial.fits([b](Config&, PlanOptions& o) { o.micro_batch = b; });
  };
  int64_t lo = 0, hi = 1;
  while (hi <= (int64_t{1} << 20) && fits_with(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_with(mid) ? lo : hi) = mid;
  }
  return lo;
}

// LoRA (r = 16) on a frozen 16-bit base.
void apply_lora16(Config& a) {
  a.lora.r = 16;
  a.lora.lora_alpha = 32;
  if (!a.fp16.enabled) a.bf16.enabled = true;
}

// A 4-bit base (QLoRA): nf4 with double quantization, computing in the run's 16-bit dtype.
void apply_4bit_base(Config& a) {
  a.quantization.load_in_4bit = true;
  a.quantization.quant_method = QuantMethod::kBitsandbytes;
  a.quantization.bnb_4bit_quant_type = Quant4bitType::kNf4;
  a.quantization.bnb_4bit_use_double_quant = true;
  a.quantization.bnb_4bit_compute_dtype =
      a.fp16.enabled ? QuantComputeDtype::kFloat16 : QuantComputeDtype::kBfloat16;
}

// Checkpointing, optimizer offload and bf16, each alone.
void advise_single_changes(const Config& c, const PlanOptions& opt, const Trial& trial,
                           MemoryPlan& p) {
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool mixed = !opt.cpu && (c.bf16.enabled || c.fp16.enabled);
  if (!opt.checkpointing && trial.fits([](Config&, PlanOptions& o) { o.checkpointing = true; })) {
    p.advice.push_back(
        "activation checkpointing of every block "
        "(activation_checkpointing.number_checkpoints = model.num_layers)");
  }
  if (!offload && trial.fits([](Config& a, PlanOptions&) {
        a.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
      })) {
    p.advice.push_back("optimizer offload (zero_optimization.offload_optimizer.device = cpu)");
  }
  if (!mixed && !opt.cpu && trial.fits([](Config& a, PlanOptions&) { a.bf16.enabled = true; })) {
    p.advice.push_back("bf16 (bf16.enabled = true)");
  }
}

// LoRA on a frozen 16-bit base, alone or with checkpointing: what single-GPU fine-tuning of the
// large MoEs takes (docs/finetune.md).
void advise_lora(const Config& c, const PlanOptions& opt, const Trial& trial, MemoryPlan& p) {
  if (p.advice.empty() && !lora_enabled(c) && !opt.cpu) {
    if (trial.fits([&](Config& a, PlanOptions&) { apply_lora16(a); })) {
      p.advice.push_back("LoRA on a frozen bf16 base (lora.r = 16 on attention and experts)");
    } else if (trial.fits([&](Config& a, PlanOptions& o) {
                 apply_lora16(a);
                 o.checkpointing = true;
               })) {
      p.advice.push_back(
          "LoRA on a frozen bf16 base (lora.r = 16 on attention and experts) with activation "
          "checkpointing of every block");
    }
  }
}

// A 4-bit base (QLoRA) under the adapters, alone or with checkpointing, with its figure.
void advise_4bit_base(const Config& c, const PlanOptions& opt, const Trial& trial, MemoryPlan& p) {
  const bool base16 = lora_enabled(c) && !quantized_base(c);
  if (!p.fits && !opt.cpu && (base16 || (p.advice.empty() && !lora_enabled(c)))) {
    const std::string what = base16 ? "a 4-bit base (quantization.load_in_4bit, nf4 + double quant)"
                                    : "LoRA on a 4-bit base (lora.r = 16 on attention and experts; "
                                      "quantization.load_in_4bit, nf4 + double quant)";
    auto qlora = [&](Config& a) {
      if (!base16) apply_lora16(a);
      apply_4bit_base(a);
    };
    double need = trial.reserved_if_fits([&](Config& a, PlanOptions&) { qlora(a); });
    std::string how = what;
    if (need == 0 && !opt.checkpointing) {
      need = trial.reserved_if_fits([&](Config& a, PlanOptions& o) {
        qlora(a);
        o.checkpointing = true;
      });
      how += " with activation checkpointing of every block";
    }
    if (need > 0) p.advice.push_back(how + ": " + gib(need) + " expected reserved");
  }
}

// Where nothing fits one device: the fewest GPUs (a power of two dividing the experts) on which
// the model trains with expert parallelism, each GPU holding num_experts / N of the routed
// experts: full fine-tuning in bf16 with ZeRO-1 and every block checkpointed (LoRA and a 4-bit
// base do not combine with expert parallelism yet, so they are left out of the trial).
void advise_expert_parallel(const Config& c, const PlanOptions& opt, const Trial& trial,
                            MemoryPlan& p) {
  if (p.fits || opt.cpu || opt.world_size > 1 || !p.advice.empty()) return;
  const int64_t E = c.moe.num_experts;
  auto expert_parallel = [](int64_t n) {
    return [n](Config& a, PlanOptions& o) {
      a.lora.r = 0;
      a.quantization.load_in_4bit = false;
      if (!a.fp16.enabled) a.bf16.enabled = true;
      a.zero_optimization.stage = std::max<int64_t>(a.zero_optimization.stage, 1);
      a.moe.expert_parallel_size = n;
      o.world_size = n;
      o.checkpointing = true;
    };
  };
  int64_t widest = 1;
  for (int64_t n = 2; n <= E && E % n == 0; n *= 2) {
    widest = n;
    const double need = trial.reserved_if_fits(expert_parallel(n));
    if (need > 0) {
      p.advice.push_back(std::to_string(n) +
                         " GPUs with expert parallelism (torchrun "
                         "--nproc-per-node " +
                         std::to_string(n) + ", moe.expert_parallel_size = " + std::to_string(n) +
                         "; full fine-tuning in bf16, ZeRO-1, every block "
                         "checkpointed: LoRA and a 4-bit base do not combine with expert "
                         "parallelism yet): " +
                         gib(need) + " expected reserved per GPU");
      return;
    }
  }
  // Nothing fits: say how far the two closest options are, so the user sees what it would take.
  const double device = opt.device_bytes;
  auto times = [device](double need) {
    char x[32];
    std::snprintf(x, sizeof x, "%.1f", need / device);
    return std::string(x) + "x this device";
  };
  const MemoryPlan q4 = trial.plan([&](Config& a, PlanOptions& o) {
    if (!lora_enabled(a)) apply_lora16(a);
    if (!quantized_base(a)) apply_4bit_base(a);
    o.checkpointing = true;
  });
  p.nearest.push_back("LoRA on a 4-bit base (nf4 + double quant), every block checkpointed: " +
                      gib(q4.reserved) + " expected reserved, " + times(q4.reserved) +
                      " (LoRA and a 4-bit base do not combine with expert parallelism yet)");
  if (widest > 1) {
    const MemoryPlan ep = trial.plan(expert_parallel(widest));
    p.nearest.push_back(std::to_string(widest) +
                        " GPUs with expert parallelism (full fine-tuning in bf16, ZeRO-1, every "
                        "block checkpointed): " +
                        gib(ep.reserved) + " expected reserved per GPU, " + times(ep.reserved) +
                        ": the weights outside the routed experts are on every GPU, and splitting "
                        "them (tensor or pipeline parallelism) is not in moe-train");
  }
}

}  // namespace

// Whether the plan fits opt.device_bytes, the largest micro-batch that does, and what would make
// a config that does not fit fit (each change tried alone on a copy).
static void fit_and_advise(const Config& c, const PlanOptions& opt, MemoryPlan& p) {
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool ckpt = opt.checkpointing;
  p.fits = fits_memory(p, opt);
  const Trial trial(c, opt);
  // The cheapest tier that fits as configured otherwise (LoRA runs keep their own rules).
  if (!lora_enabled(c) && opt.world_size <= 1) {
    if (std::optional<std::string> tier = cheapest_fitting_tier(c, trial)) p.cheapest_tier = *tier;
  }
  p.max_micro_batch = largest_fitting_micro_batch(trial);
  if (p.fits && p.max_micro_batch >= p.micro_batch) return;
  advise_single_changes(c, opt, trial, p);
  advise_lora(c, opt, trial, p);
  advise_4bit_base(c, opt, trial, p);
  if (p.advice.empty() && !ckpt && !offload && trial.fits([](Config& a, PlanOptions& o) {
        o.checkpointing = true;
        a.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
      })) {
    p.advice.push_back("activation checkpointing of every block together with optimizer offload");
  }
  advise_expert_parallel(c, opt, trial, p);
  if (p.max_micro_batch > 0) {
    p.advice.push_back("train_micro_batch_size_per_gpu = " + std::to_string(p.max_micro_batch) +
                       " with gradient_accumulation_steps raised to keep train_batch_size");
  }
}

namespace {

// Gradient-reduction buffers of data parallelism (docs/distributed.md).
double communication_bytes(GradientReduction reduction, double bucket, double trained, double N) {
  switch (reduction) {
    case GradientReduction::kNone:
      return 0;
    case GradientReduction::kAllReduceAfterBackward:
      return std::min(bucket, 4 * trained);
    case GradientReduction::kReduceToOwnersInBackward:
      return std::min(3 * bucket, 4 * trained * (N - 1) / N);
    case GradientReduction::kReducerInBackward:
      return 4 * trained;
  }
  return 0;
}

// What the optimizer step allocates beyond its states (on the host under offload).
double update_transient_bytes(const Config& c, const PlanOptions& opt, double trained) {
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool w16 = c.training.param_dtype != ParamDtype::kFp32;
  const bool kahan = w16 && c.optimizer.main_params_dtype == ParamDtype::kBf16;
  // The reference update (bf16 / 8-bit moments) reads one parameter's moments into fp32 and
  // quantises them back: ~16 B per value of the largest parameter (fp32 m, v, the denominator
  // and a square root), 32 B with 8-bit moments (the padded copy, scaled rows and bucket
  // indices of the quantisation).
  const bool eight = c.optimizer.exp_avg_dtype == StateDtype::k8Bit ||
                     c.optimizer.exp_avg_sq_dtype == StateDtype::k8Bit;
  const double largest = largest_trained_parameter(c);
  // On a GPU with both moments 8-bit the fused kernel (kernels/adam8bit.h) steps in place.
  const bool kernel8 = fused_kernels(c, opt) && !offload &&
                       c.optimizer.exp_avg_dtype == StateDtype::k8Bit &&
                       c.optimizer.exp_avg_sq_dtype == StateDtype::k8Bit;
  double bytes =
      moment_bytes_per_parameter(c) == 8 || kernel8 ? 0 : (eight ? 32.0 : 16.0) * largest;
  // 16-bit weights on the device: a bucket (64 MiB of fp32, plus the parameter that fills it)
  // of widened gradients; a bf16 master adds its fp32 views and the Kahan temporaries of one
  // parameter (old, sum, rounded, difference: ~14 B per value).
  if (w16 && !offload) {
    const double bucket16 = std::min(4 * trained, 64.0 * (1 << 20) + 4 * largest);
    bytes +=
        kahan ? std::min(8 * trained, 64.0 * (1 << 20) + 8 * largest) + 14 * largest : bucket16;
  }
  return bytes;
}

// What the terms of a plan share: the parameters that train, stay frozen or live on other
// ranks; the data-parallel layout; the dtypes of the weights and gradients.
struct PlanBasis {
  double P, N;
  bool offload, mixed;
  DataParallelMode dp;
  double trained, sharded, frozen;
  bool w16, accumulate, streamed, fp32_sums, kahan;
};

PlanBasis plan_basis(const Config& c, const PlanOptions& opt, int64_t parameters) {
  const double P = static_cast<double>(parameters);
  const double N = static_cast<double>(std::max<int64_t>(1, opt.world_size));
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool mixed = !opt.cpu && (c.bf16.enabled || c.fp16.enabled);
  const DataParallelMode dp = data_parallel_mode(c, opt.world_size);
  // LoRA (config/lora.h): only the adapters and modules_to_save have gradients and Adam state;
  // the frozen base is fp32 on a CPU, the compute dtype (2 bytes) under bf16/fp16 on a GPU.
  const LoraParameterCounts lora = lora_parameter_counts(c);
  // Expert parallelism: a rank holds num_experts / EP of the routed experts, with their
  // gradients and Adam state (docs/distributed.md).
  const double held_elsewhere =
      routed_expert_parameters(c) * (1 - 1.0 / static_cast<double>(dp.expert_parallel));
  const double trained = static_cast<double>(lora.adapter + lora.trainable_base) - held_elsewhere;
  // ZeRO shares: every parameter is owned by one rank of the world, or with expert parallelism
  // (the experts shared out over their N / EP replicas) by one rank of its replicas: either way
  // 1/N of all the parameters per rank.
  const double sharded = trained + held_elsewhere;
  const double frozen = static_cast<double>(lora.frozen_base);
  // 16-bit working weights (training.param_dtype): 16-bit gradients, summed in fp32 over
  // micro-batches (and widened before fp16's unscaling); fp32 masters in the optimizer.
  const bool w16 = c.training.param_dtype != ParamDtype::kFp32;
  const bool accumulate = c.gradient_accumulation_steps > 1;
  // Offload in one process with overlap_comm streams gradients to the host during the backward
  // (optim/offload_gradient_stream.h): 16-bit ones are released on the device as they are
  // copied and summed in fp32 on the host, so the device holds no fp32 sums.
  const bool streamed = offload && c.zero_optimization.overlap_comm && N == 1;
  const bool fp32_sums = w16 && (accumulate || c.fp16.enabled) && !streamed;
  const bool kahan = w16 && c.optimizer.main_params_dtype == ParamDtype::kBf16;
  return {P,      N,   offload,    mixed,    dp,        trained, sharded,
          frozen, w16, accumulate, streamed, fp32_sums, kahan};
}

// Gradients, communication buffers, the optimizer's states (on the device or the host), master
// weights and the update's transients.
void plan_training_state(const Config& c, const PlanOptions& opt, const PlanBasis& b,
                         MemoryPlan& p) {
  const double N = b.N, trained = b.trained, sharded = b.sharded;
  const bool offload = b.offload, w16 = b.w16, streamed = b.streamed, fp32_sums = b.fp32_sums;
  const DataParallelMode& dp = b.dp;
  const double bucket = static_cast<double>(reduce_bucket_bytes(c));
  p.gradients = (streamed && w16     ? 0
                 : !w16 || fp32_sums ? 4
                                     : 2) *
                (dp.shards_gradients() ? sharded / N : trained);
  p.communication = communication_bytes(dp.reduction, bucket, trained, N);
  if (dp.expert_parallel > 1) {  // the all-to-all's received rows and their expert-order copy
    const Shape rows = shape_of(c, p.micro_batch, opt);
    p.communication += 2 * rows.T * rows.k * rows.d * rows.a;
  }
  const double state_share = dp.shards_optimizer() ? N : 1;
  const double moments = moment_bytes_per_parameter(c);
  p.optimizer_states = offload ? 0 : moments * (dp.shards_optimizer() ? sharded / N : trained);
  // Moments + fp32 master copy + gradient staging (in the gradients' dtype); streamed: fp32
  // gradients, and a 16-bit staging buffer for 16-bit weights (their copies both ways).
  // One host buffer per dtype, packed (optim/host_arena.h): no allocator rounding to add. Under
  // 16-bit weights the norms and routers stay fp32: fp32 staging, no 16-bit copy.
  const double staging = streamed ? 4 + (w16 ? 2 : 0) : !w16 || fp32_sums ? 4 : 2;
  const double fp32_held =
      w16 ? std::min(trained, static_cast<double>(fp32_parameters_under_16bit_weights(c))) : 0;
  const double staging_bytes = staging * trained + (streamed ? -2 : 4 - staging) * fp32_held;
  p.host_states = offload ? ((moments + 4) * trained + staging_bytes) / state_share : 0;
  p.host = p.host_states;
  p.master_weights = !w16 || offload ? 0 : (b.kahan ? 2 : 4) * trained;
  p.update_transient = update_transient_bytes(c, opt, trained);
}

// The weights: the trained ones, the frozen base (16-bit under mixed precision or 16-bit
// weights), a 4-bit base, and autocast's 16-bit copies.
void plan_weights(const Config& c, const PlanOptions& opt, const PlanBasis& b, MemoryPlan& p) {
  // QLoRA: the quantized matrices at their 4-bit bytes, the rest of the frozen base as above.
  const Quantized4bitBase q4 = quantized_4bit_base(c, opt);
  p.quantized_base = q4.bytes;
  p.quantized_parameters = q4.parameters;
  p.weights = (b.w16 ? 2 : 4) * b.trained +
              (b.mixed || b.w16 ? 2 : 4) * (b.frozen - static_cast<double>(q4.parameters)) +
              q4.bytes;
  // Each 4-bit GEMM dequantizes its group into a temporary freed when the GEMM returns, in the
  // forward, its recomputation and again in the backward; autograd runs one node at a time, so
  // one group (the largest) is alive at a moment (docs/memory.md).
  p.dequant_scratch = q4.largest_group_bytes;
  // Autocast keeps the bf16/fp16 copy of every fp32 matmul weight from the forward to the end of
  // the backward (its cache is cleared after the step); 16-bit weights need none.
  p.low_precision_weights = b.mixed && !b.w16 ? 2 * b.trained : 0;
}

// The activations (as configured, and with and without checkpointing), the backward's
// transients, the peak and what the allocator reserves.
void plan_peak(const Config& c, const PlanOptions& opt, const PlanBasis& b, MemoryPlan& p) {
  const double fixed = p.weights + p.optimizer_states + p.low_precision_weights + p.master_weights;
  // The backward walk spreads gradients over the layers' parameters: scale them to the share
  // that trains.
  // Gradients (fp32). Data parallel (docs/distributed.md): ZeRO-2 with overlap_comm reduces each
  // gradient onto its owner during the backward and releases the others as it goes, so a rank
  // holds its share (4/N bytes per parameter, accumulating as the backward proceeds) plus the
  // bucket being filled and at most two in flight. Otherwise every gradient exists in the
  // backward; ZeRO-2 without the overlap releases the foreign ones before the update. DDP's
  // Reducer (stages 0-1 with the overlap) keeps its buckets, a second copy of every gradient.
  const bool partitioned = b.dp.reduction == GradientReduction::kReduceToOwnersInBackward;
  const double grad_bytes = !b.w16 ? 4 : b.fp32_sums && b.accumulate ? 6 : 2;  // in a backward
  const double grad_per_param = (partitioned ? grad_bytes / b.N : grad_bytes) * b.trained / b.P;
  const Shape s = shape_of(c, p.micro_batch, opt);
  const bool ckpt = opt.checkpointing;
  const Walk as_configured = walk_backward(c, s, ckpt, grad_per_param, b.accumulate);
  p.activations = as_configured.activations;
  Config no_checkpoint = c;
  no_checkpoint.activation_checkpointing.number_checkpoints = 0;
  p.activations_no_checkpoint =
      walk_backward(no_checkpoint, s, false, grad_per_param, false).activations;
  p.activations_checkpoint = walk_backward(c, s, true, grad_per_param, false).activations;
  p.backward_transient = as_configured.transient;
  p.host += as_configured.host;
  // The optimizer step: every gradient, the clipping norms, the fused update (no temporaries)
  // or the reference update's fp32 copies (on the host under offload).
  const double step_peak = p.gradients + 8 * static_cast<double>(c.model.num_layers) * 64 +
                           (b.offload ? 0 : p.update_transient);
  if (b.offload) p.host += p.update_transient;
  p.peak =
      fixed + std::max(as_configured.peak_dynamic + p.communication + p.dequant_scratch, step_peak);
  // The caching allocator rounds and fragments (~5% measured by PyTorch users on LLM training);
  // the CUDA context and cuBLAS/cuDNN workspaces add about 0.5-1 GiB per process.
  p.reserved = opt.cpu ? p.peak : p.peak * 1.05 + 0.75 * kGiB;
}

}  // namespace

MemoryPlan plan_memory(const Config& c, const PlanOptions& opt) {
  MemoryPlan p;
  p.parameters = count_parameters(c);
  p.active_parameters = active_parameters_per_token(c);
  p.micro_batch = opt.micro_batch > 0 ? opt.micro_batch : c.train_micro_batch_size_per_gpu;
  // fp32 weights always (they are the master copy); fp32 gradients; Adam's two fp32 moments.
  const PlanBasis basis = plan_basis(c, opt, p.parameters);
  plan_training_state(c, opt, basis, p);
  plan_weights(c, opt, basis, p);
  plan_peak(c, opt, basis, p);
  if (opt.device_bytes > 0) fit_and_advise(c, opt, p);
  return p;
}

double quantized_4bit_bytes(int64_t values, bool double_quant) {
  // bitsandbytes' blocks (quant::kBlocksize, kNestedBlocksize; that header needs LibTorch).
  constexpr int64_t kBlock = 64, kNestedBlock = 256;
  const int64_t blocks = (values + kBlock - 1) / kBlock;
  const double codes = static_cast<double>((values + 1) / 2);
  if (!double_quant) return codes + 4.0 * static_cast<double>(blocks);
  const int64_t nested = (blocks + kNestedBlock - 1) / kNestedBlock;
  return codes + static_cast<double>(blocks) + 4.0 * static_cast<double>(nested) + 4.0;
}

Quantized4bitBase quantized_4bit_base(const Config& c, const PlanOptions& opt) {
  Quantized4bitBase q;
  if (!quantized_base(c)) return q;
  const bool mxfp4 = c.quantization.quant_method == QuantMethod::kMxfp4;
  const bool dq = c.quantization.bnb_4bit_use_double_quant;
  // Linear4bitFn dequantizes to bnb_4bit_compute_dtype; the grouped GEMM over a whole expert
  // stack (a GPU with bf16 activations and aligned widths; sm_90 at run time, assumed here:
  // the larger group) to bf16 (layers/frozen_4bit.cpp, moe/experts.cpp).
  const double compute =
      c.quantization.bnb_4bit_compute_dtype == QuantComputeDtype::kFloat32 ? 4.0 : 2.0;
  const LoraTargets t = lora_targets(c.lora);
  const bool bf16_rows =
      c.training.param_dtype == ParamDtype::kBf16 || (c.bf16.enabled && !c.fp16.enabled);
  const bool grouped = !opt.cpu && bf16_rows && c.model.hidden_size % 8 == 0 &&
                       expert_hidden_size(c) % 8 == 0 && t.experts_gate_up_rank % 8 == 0 &&
                       (!t.experts_down || c.lora.r % 8 == 0);
  const int64_t q_rows = c.model.num_heads * head_dim(c),
                kv_rows = key_value_heads(c) * head_dim(c);
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  auto add = [&](int64_t values, int64_t count) {
    q.parameters += values * count;
    q.matrices += count;
    // MXFP4: 16 bytes of codes and one scale byte per 32 values.
    q.bytes += static_cast<double>(count) * (mxfp4 ? static_cast<double>(values) * 17.0 / 32.0
                                                   : quantized_4bit_bytes(values, dq));
  };
  auto group = [&](double values, double bytes_per_value) {
    if (values * bytes_per_value > q.largest_group_bytes) {
      q.largest_group_values = values;
      q.largest_group_bytes = values * bytes_per_value;
    }
  };
  for (const auto& p : model::parameter_layout(c)) {
    if (saved_in_full(c.lora, p.name, c.model.tie_embeddings)) continue;
    const bool expert_stack = ends_with(p.name, ".moe.experts.w_gate") ||
                              ends_with(p.name, ".moe.experts.w_up") ||
                              ends_with(p.name, ".moe.experts.w_down");
    if (mxfp4 && !expert_stack) continue;         // MXFP4 holds the experts only
    if (ends_with(p.name, ".attn.qkv.weight")) {  // q, k and v: three matrices, one GEMM
      const int64_t d = p.shape[1];
      add(q_rows * d, 1);
      add(kv_rows * d, 2);
      group(static_cast<double>(p.shape[0] * d), compute);
    } else if (ends_with(p.name, ".attn.out.weight") || ends_with(p.name, ".attn.q_proj.weight") ||
               ends_with(p.name, ".attn.q_a_proj.weight") ||
               ends_with(p.name, ".attn.q_b_proj.weight") ||
               ends_with(p.name, ".attn.kv_a_proj.weight") ||
               ends_with(p.name, ".attn.kv_b_proj.weight") ||
               ends_with(p.name, ".mlp.gate_proj.weight") ||
               ends_with(p.name, ".mlp.up_proj.weight") ||
               ends_with(p.name, ".mlp.down_proj.weight")) {
      add(p.shape[0] * p.shape[1], 1);
      group(static_cast<double>(p.shape[0] * p.shape[1]), compute);
    } else if (expert_stack) {
      const int64_t matrix = p.shape[1] * p.shape[2];
      add(matrix, p.shape[0]);
      if (grouped) {
        // quantization.dequant_scratch_mib: a few experts at a time (layers/frozen_4bit.cpp).
        const int64_t per_expert = matrix * 2, experts = p.shape[0];
        const int64_t budget = c.quantization.dequant_scratch_mib * (int64_t{1} << 20);
        const int64_t chunk =
            budget > 0 ? std::clamp<int64_t>(budget / per_expert, 1, experts) : experts;
        group(static_cast<double>(chunk * matrix), 2.0);
      } else {
        group(static_cast<double>(matrix), compute);
      }
    }
  }
  return q;
}

double moment_bytes_per_parameter(const Config& c) {
  auto bytes = [](StateDtype d) {
    switch (d) {
      case StateDtype::kBf16:
        return 2.0;
      case StateDtype::k8Bit:
        return 1.0 + 4.0 / 256;
      default:
        return 4.0;
    }
  };
  return bytes(c.optimizer.exp_avg_dtype) + bytes(c.optimizer.exp_avg_sq_dtype);
}

namespace {

// The table of format_plan: a row per term, with bytes per parameter where that means something.
class PlanRows {
 public:
  explicit PlanRows(double parameters) : parameters_(parameters) {}

  void row(const char* what, double bytes, const std::string& note) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-34s %12s  %s", what, gib(bytes).c_str(), note.c_str());
    std::string l = line;
    l.erase(l.find_last_not_of(' ') + 1);
    out += l + "\n";
  }
  std::string per(double bytes) const {
    char b[48];
    std::snprintf(b, sizeof b, "%.2f bytes/parameter", bytes / std::max(1.0, parameters_));
    return std::string(b);
  }

  std::string out;

 private:
  double parameters_;
};

// The run's sizes, and its LoRA parameter counts.
std::string plan_header(const Config& c, const PlanOptions& opt, const MemoryPlan& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "parameters: %.4g total, %.4g active per token; micro-batch %lld x %lld tokens; "
                "world size %lld, ZeRO stage %lld\n",
                static_cast<double>(p.parameters), static_cast<double>(p.active_parameters),
                static_cast<long long>(p.micro_batch), static_cast<long long>(c.model.seq_len),
                static_cast<long long>(opt.world_size),
                static_cast<long long>(c.zero_optimization.stage));
  out += line;
  out += std::string(opt.cpu ? "host memory" : "device memory") + " of one training step:\n";
  if (lora_enabled(c)) {
    const LoraParameterCounts n = lora_parameter_counts(c);
    std::snprintf(line, sizeof line,
                  "LoRA r = %lld: %.4g adapter parameters, %.4g base parameters trained in full, "
                  "%.4g frozen (%s)\n",
                  static_cast<long long>(c.lora.r), static_cast<double>(n.adapter),
                  static_cast<double>(n.trainable_base), static_cast<double>(n.frozen_base),
                  (std::string(p.quantized_parameters > 0 ? "4-bit matrices, the rest " : "") +
                   (!opt.cpu && (c.bf16.enabled || c.fp16.enabled) ? "16-bit" : "fp32"))
                      .c_str());
    out += line;
  }
  return out;
}

// Weights (and their 4-bit part), gradients, master weights, moments and autocast's copies.
void state_rows(const Config& c, const MemoryPlan& p, PlanRows& t) {
  const bool w16 = c.training.param_dtype != ParamDtype::kFp32;
  const std::string weight_dtype(name(c.training.param_dtype));
  t.row(lora_enabled(c) ? "weights (frozen base + fp32 trained)"
                        : ("weights (" + weight_dtype + ")").c_str(),
        p.weights, t.per(p.weights));
  if (p.quantized_parameters > 0) {
    const QuantizationConfig& q = c.quantization;
    char b[96];
    std::snprintf(b, sizeof b, "%.4g parameters, %.4f bytes each",
                  static_cast<double>(p.quantized_parameters),
                  p.quantized_base / static_cast<double>(p.quantized_parameters));
    const std::string how = q.quant_method == QuantMethod::kMxfp4
                                ? std::string("MXFP4 experts")
                                : std::string(name(q.bnb_4bit_quant_type)) +
                                      (q.bnb_4bit_use_double_quant ? ", double quant" : "");
    t.row(("  4-bit part (" + how + ")").c_str(), p.quantized_base, b);
  }
  t.row(p.gradients > 2.5 * static_cast<double>(p.parameters) || !w16
            ? "gradients (fp32)"
            : ("gradients (" + weight_dtype + ")").c_str(),
        p.gradients, t.per(p.gradients));
  if (p.master_weights > 0) {
    t.row(c.optimizer.main_params_dtype == ParamDtype::kBf16 ? "bf16 master compensation (Kahan)"
                                                             : "fp32 master weights",
          p.master_weights, t.per(p.master_weights));
  }
  const std::string moment_names = std::string(name(c.optimizer.exp_avg_dtype)) + "/" +
                                   std::string(name(c.optimizer.exp_avg_sq_dtype));
  t.row(("Adam moments (" + moment_names + ")").c_str(), p.optimizer_states,
        p.optimizer_states == 0 ? "offloaded to the host" : t.per(p.optimizer_states));
  if (p.low_precision_weights > 0) {
    t.row("bf16/fp16 weight copies (autocast)", p.low_precision_weights,
          t.per(p.low_precision_weights));
  }
}

// Activations, transients, communication buffers, the peak, the reserve and the host's share.
void dynamic_rows(const Config& c, const PlanOptions& opt, const MemoryPlan& p, PlanRows& t) {
  t.row("activations, one micro-batch", p.activations,
        c.activation_checkpointing.number_checkpoints > 0 || opt.checkpointing
            ? "with activation checkpointing"
            : "no activation checkpointing");
  t.row("  without checkpointing", p.activations_no_checkpoint, "");
  t.row("  every block checkpointed", p.activations_checkpoint, "");
  t.row("backward transients", p.backward_transient, "largest short-lived buffers");
  if (p.dequant_scratch > 0) {
    t.row("4-bit dequantization scratch", p.dequant_scratch,
          "the largest matrix group dequantized for one GEMM");
  }
  if (p.update_transient > 0) {
    t.row("update transients", p.update_transient,
          "fp32 copies: the largest parameter's moments, 16-bit weights' gradient buckets");
  }
  if (p.communication > 0) {
    const GradientReduction r = data_parallel_mode(c, opt.world_size).reduction;
    t.row("gradient communication", p.communication,
          r == GradientReduction::kReduceToOwnersInBackward
              ? "ZeRO-2 buckets being reduced onto owners"
          : r == GradientReduction::kReducerInBackward
              ? "DDP Reducer buckets (a copy of every gradient)"
              : "one all-reduce bucket after the backward");
  }
  t.row("peak of tensors", p.peak, "the worst moment of the backward or the update");
  if (!opt.cpu) {
    t.row("expected reserved", p.reserved, "+5% allocator, +0.75 GiB CUDA context");
    // What torch.cuda.max_memory_reserved() reports (and Unsloth's notebooks quote): the
    // allocator's share, without the context.
    t.row("  of it, the allocator's", p.peak * 1.05, "torch.cuda.max_memory_reserved()");
  }
  if (p.host > 0) {
    t.row("host (offload)", p.host,
          c.activation_checkpointing.cpu_checkpointing
              ? "moments, master weights, gradient staging; checkpointed inputs"
              : "moments, master weights, gradient staging");
  }
}

// Whether the plan fits the device, and the advice (with a device size to judge against).
std::string plan_verdict(const PlanOptions& opt, const MemoryPlan& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "verdict: %s on %s (%s needed); largest micro-batch that fits: %lld\n",
                p.fits ? "fits" : "does NOT fit", gib(opt.device_bytes).c_str(),
                gib(p.reserved).c_str(), static_cast<long long>(p.max_micro_batch));
  out += line;
  for (const auto& a : p.advice) out += "  would help: " + a + "\n";
  if (!p.cheapest_tier.empty()) out += "  cheapest tier that fits: " + p.cheapest_tier + "\n";
  if (!p.fits && p.advice.empty()) {
    out +=
        "  nothing tried fits one device (checkpointing, offload, LoRA, a 4-bit base, "
        "micro-batch 1): more devices (data parallel with ZeRO), a shorter model.seq_len, or a "
        "smaller model\n";
  }
  for (const auto& n : p.nearest) out += "  nearest: " + n + "\n";
  return out;
}

}  // namespace

std::string format_plan(const Config& c, const PlanOptions& opt, const MemoryPlan& p) {
  PlanRows t(static_cast<double>(p.parameters));
  t.out = plan_header(c, opt, p);
  state_rows(c, p, t);
  dynamic_rows(c, opt, p, t);
  if (opt.device_bytes > 0) t.out += plan_verdict(opt, p);
  return t.out;
}

double parse_memory_size(const std::string& text, const std::string& what) {
  std::string t;
  for (char ch : text) {
    if (ch != ' ') t += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  size_t i = 0;
  while (i < t.size() &&
         (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' || t[i] == 'E' ||
          ((t[i] == '+' || t[i] == '-') && i > 0 && t[i - 1] == 'E'))) {
    ++i;
  }
  double v = 0;
  try {
    v = i == 0 ? -1 : std::stod(t.substr(0, i));
  } catch (const std::exception&) {
    v = -1;
  }
  const std::string unit = t.substr(i);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  if (unit == "TB") scale = 1e12;
  if (unit == "KIB") scale = 1024.0;
  if (unit == "MIB") scale = 1024.0 * 1024.0;
  if (unit == "GIB") scale = kGiB;
  if (unit == "TIB") scale = kGiB * 1024.0;
  if (v <= 0 || scale == 0) {
    throw UserError(what + " = \"" + text + "\": expected a size such as 141GiB, 80GB or 24GiB");
  }
  return v * scale;
}

}  // namespace moe::config
