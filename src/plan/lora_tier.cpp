// The LoRA tier (config/lora.h): the frozen base the adapters train on (16-bit under mixed
// precision or 16-bit weights, fp32 otherwise, its 4-bit part at the 4-bit base tier's bytes),
// and what the adapters keep for the backward. Only the adapters and lora.modules_to_save have
// gradients and Adam state (the plan's basis counts them as trained).
#include <cstdint>

#include "moe/config/lora.h"
#include "plan_parts.h"

namespace moe::plan {

using config::lora_enabled;
using config::lora_targets;
using config::LoraTargets;

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

// Multi-head latent attention: each adapter's x A [T, r].
double lora_latent_attention_saved(const Config& c, const Shape& s) {
  if (!lora_enabled(c)) return 0;
  const LoraTargets t = lora_targets(c.lora);
  const double qr = static_cast<double>(c.model.q_lora_rank);
  const int64_t n =
      (t.q && qr == 0) + (t.q_a && qr > 0) + (t.q_b && qr > 0) + t.kv_a + t.kv_b + t.o;
  return static_cast<double>(n) * s.T * static_cast<double>(c.lora.r) * s.a;
}

double lora_ffn_saved(const Config& c, const Shape& s, bool moe_layer) {
  if (!lora_enabled(c)) return 0;
  const LoraTargets t = lora_targets(c.lora);
  const double r = static_cast<double>(c.lora.r);
  if (!moe_layer) return t.dense_mlp ? 3 * s.T * r * s.a : 0;
  const double rows = s.T * s.k;
  const double up_rank =
      config::gated_mlp(c) ? static_cast<double>(t.experts_gate_up_rank) : (t.experts_up ? r : 0);
  return rows * (up_rank + (t.experts_down ? r : 0)) * s.a;
}

// The frozen base: the compute dtype (2 bytes) under bf16/fp16 on a GPU or 16-bit weights, fp32
// on a CPU; QLoRA's quantized matrices at their 4-bit bytes (the 4-bit base part's figures).
void add_lora_frozen_base(const PlanContext& x, PlanDraft& d) {
  const PlanBasis& b = x.b;
  MemoryPlan& p = d.plan;
  p.weights =
      p.weights +
      (b.mixed || b.w16 ? 2 : 4) * (b.frozen - static_cast<double>(p.quantized_parameters)) +
      p.quantized_base;
}

}  // namespace moe::plan
