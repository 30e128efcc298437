// The 4-bit base tier (QLoRA, quantization.load_in_4bit): the matrices the model holds in 4 bits
// at their exact bitsandbytes (or MXFP4) bytes, and the dequantized copy of the largest matrix
// group a 4-bit GEMM reads. The LoRA part adds the 4-bit bytes to the frozen base's weights.
#include "moe/plan/quantized_base_tier.h"

#include <algorithm>
#include <string>

#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

using config::QuantComputeDtype;
using config::QuantMethod;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// How a parameter of the layout is held under a 4-bit base.
enum class Held4bit {
  kNot,          // as it is (embeddings, norms, routers, modules trained in full)
  kFusedQkv,     // q, k and v: three matrices, one GEMM
  kMatrix,       // one matrix, one GEMM
  kExpertStack,  // a routed expert stack: a matrix per expert
};

Held4bit held_in_4bit(const std::string& name, bool mxfp4) {
  const bool expert_stack = ends_with(name, ".moe.experts.w_gate") ||
                            ends_with(name, ".moe.experts.w_up") ||
                            ends_with(name, ".moe.experts.w_down");
  if (mxfp4 && !expert_stack) return Held4bit::kNot;  // MXFP4 holds the experts only
  if (ends_with(name, ".attn.qkv.weight")) return Held4bit::kFusedQkv;
  static const char* const kMatrices[] = {
      ".attn.out.weight", ".attn.q_proj.weight", ".attn.q_a_proj.weight", ".attn.q_b_proj.weight",
      ".attn.kv_a_proj.weight", ".attn.kv_b_proj.weight", ".mlp.gate_proj.weight",
      ".mlp.up_proj.weight", ".mlp.down_proj.weight", ".mamba.in_proj.weight",
      ".mamba.out_proj.weight",
      // Gated DeltaNet's (model/transformer.cpp quantizes them as bitsandbytes does every Linear)
      ".linear_attn.in_proj_qkv.weight", ".linear_attn.in_proj_z.weight",
      ".linear_attn.in_proj_b.weight", ".linear_attn.in_proj_a.weight",
      ".linear_attn.in_proj_qkvz.weight", ".linear_attn.in_proj_ba.weight",
      ".linear_attn.out_proj.weight"};
  for (const char* tail : kMatrices) {
    if (ends_with(name, tail)) return Held4bit::kMatrix;
  }
  return expert_stack ? Held4bit::kExpertStack : Held4bit::kNot;
}

// Whether the experts dequantize a whole stack (or a chunk of it) for the grouped GEMM: a GPU
// with bf16 activations and aligned widths (sm_90 at run time, assumed here: the larger group).
bool grouped_expert_gemm(const Config& c, const PlanOptions& opt) {
  const config::LoraTargets t = config::lora_targets(c.lora);
  const bool bf16_rows =
      c.training.param_dtype == ParamDtype::kBf16 || (c.bf16.enabled && !c.fp16.enabled);
  return !opt.cpu && bf16_rows && config::expert_model_size(c) % 8 == 0 &&
         config::expert_hidden_size(c) % 8 == 0 && t.experts_gate_up_rank % 8 == 0 &&
         (!t.experts_down || c.lora.r % 8 == 0);
}

// The sum over the matrices, and the largest group dequantized at once.
class Base4bitSum {
 public:
  Base4bitSum(bool mxfp4, bool double_quant) : mxfp4_(mxfp4), double_quant_(double_quant) {}

  // `count` matrices of `values` values each.
  void add(int64_t values, int64_t count) {
    q.parameters += values * count;
    q.matrices += count;
    // MXFP4: 16 bytes of codes and one scale byte per 32 values.
    q.bytes += static_cast<double>(count) * (mxfp4_ ? static_cast<double>(values) * 17.0 / 32.0
                                                    : quantized_4bit_bytes(values, double_quant_));
  }
  // A group of `values` dequantized at once to `bytes_per_value`.
  void group(double values, double bytes_per_value) {
    if (values * bytes_per_value > q.largest_group_bytes) {
      q.largest_group_values = values;
      q.largest_group_bytes = values * bytes_per_value;
    }
  }

  Quantized4bitBase q;

 private:
  bool mxfp4_, double_quant_;
};

}  // namespace

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
  if (!config::quantized_base(c)) return Quantized4bitBase{};
  const bool mxfp4 = c.quantization.quant_method == QuantMethod::kMxfp4;
  Base4bitSum sum(mxfp4, c.quantization.bnb_4bit_use_double_quant);
  // Linear4bitFn dequantizes to bnb_4bit_compute_dtype; the grouped GEMM over a whole expert
  // stack to bf16 (layers/frozen_4bit.cpp, moe/experts.cpp).
  const double compute =
      c.quantization.bnb_4bit_compute_dtype == QuantComputeDtype::kFloat32 ? 4.0 : 2.0;
  const bool grouped = grouped_expert_gemm(c, opt);
  const int64_t q_rows = c.model.num_heads * config::head_dim(c),
                kv_rows = config::key_value_heads(c) * config::head_dim(c);
  for (const auto& p : config::parameter_layout(c)) {
    if (config::saved_in_full(c.lora, p.name, c.model.tie_embeddings)) continue;
    switch (held_in_4bit(p.name, mxfp4)) {
      case Held4bit::kNot:
        break;
      case Held4bit::kFusedQkv: {
        const int64_t d = p.shape[1];
        sum.add(q_rows * d, 1);
        sum.add(kv_rows * d, 2);
        sum.group(static_cast<double>(p.shape[0] * d), compute);
        break;
      }
      case Held4bit::kMatrix:
        sum.add(p.shape[0] * p.shape[1], 1);
        sum.group(static_cast<double>(p.shape[0] * p.shape[1]), compute);
        break;
      case Held4bit::kExpertStack: {
        const int64_t matrix = p.shape[1] * p.shape[2], experts = p.shape[0];
        sum.add(matrix, experts);
        if (!grouped) {
          sum.group(static_cast<double>(matrix), compute);
          break;
        }
        // quantization.dequant_scratch_mib: a few experts at a time (layers/frozen_4bit.cpp).
        const int64_t per_expert = matrix * 2;
        const int64_t budget = c.quantization.dequant_scratch_mib * (int64_t{1} << 20);
        const int64_t chunk =
            budget > 0 ? std::clamp<int64_t>(budget / per_expert, 1, experts) : experts;
        sum.group(static_cast<double>(chunk * matrix), 2.0);
        break;
      }
    }
  }
  return sum.q;
}

// The 4-bit part of the frozen base, and the largest group dequantized for one GEMM: each 4-bit
// GEMM dequantizes its group into a temporary freed when the GEMM returns, in the forward, its
// recomputation and again in the backward; autograd runs one node at a time, so one group (the
// largest) is alive at a moment (docs/memory.md).
void add_quantized_base(const PlanContext& x, PlanDraft& d) {
  const Quantized4bitBase q4 = quantized_4bit_base(x.c, x.opt);
  d.plan.quantized_base = q4.bytes;
  d.plan.quantized_parameters = q4.parameters;
  d.plan.dequant_scratch = q4.largest_group_bytes;
}

}  // namespace moe::plan
