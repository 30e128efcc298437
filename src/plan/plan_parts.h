// What the parts of the memory planner share (src/plan only): the basis every tier reads, the
// plan being assembled, the activation shapes, and each tier's entry point. One part per memory
// tier; memory_plan.cpp runs them in a list, so a new tier is a new part and one line there.
#pragma once

#include <cstdint>
#include <string>

#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/plan/memory_plan.h"

namespace moe::plan {

using config::Config;
using config::DataParallelMode;
using config::GradientReduction;
using config::OffloadDevice;
using config::ParamDtype;
using config::StateDtype;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "1.25 GiB" at or above a GiB, "512.0 MiB" below (plan_report.cpp).
std::string gib(double bytes);

// What the terms of a plan share: the parameters that train, stay frozen or live on other
// ranks; the data-parallel layout; the dtypes of the weights and gradients.
struct PlanBasis {
  double P, N;
  bool offload, mixed;
  DataParallelMode dp;
  double trained, sharded, frozen;
  bool w16, accumulate, streamed, fp32_sums, kahan;
};

// A plan's inputs: the config, the options and their basis.
struct PlanContext {
  const Config& c;
  const PlanOptions& opt;
  PlanBasis b;
};

// The plan as the parts fill it in, with what they hand the peak beyond the plan's own figures.
struct PlanDraft {
  MemoryPlan plan;
  double backward_peak = 0;     // activations, transients and gradients at the backward's worst
  double update_on_device = 0;  // the update's transients on the device (offload: on the host)
};

// One memory tier: adds its terms to the draft (reading those of the parts before it).
struct PlanPart {
  const char* name;
  void (*add)(const PlanContext& x, PlanDraft& d);
};

// The parts, in the order memory_plan.cpp runs them.
void add_quantized_base(const PlanContext& x, PlanDraft& d);      // quantized_base_tier.cpp
void add_weights_and_states(const PlanContext& x, PlanDraft& d);  // weights_tier.cpp
void add_lora_frozen_base(const PlanContext& x, PlanDraft& d);    // lora_tier.cpp
void add_expert_offload(const PlanContext& x, PlanDraft& d);      // expert_offload_tier.cpp
void add_parallel(const PlanContext& x, PlanDraft& d);            // parallel_tier.cpp
void add_activations(const PlanContext& x, PlanDraft& d);         // activations_tier.cpp
void add_offload(const PlanContext& x, PlanDraft& d);             // offload_tier.cpp

// The sizes of one micro-batch's activations (activations_tier.cpp).
struct Shape {
  double T, d, H, KV, hd, E, k, f, fd, V, fs;
  double de;  // the routed experts' width: d, or moe.latent_size (LatentMoE)
  double a;   // bytes of an activation element (2 under bf16/fp16 autocast on a GPU, else 4)
  // silu(gate) * up kept per FFN row: 3 (gate, up, the product) with the fused kernel
  // (kernels/swiglu.h: silu(gate) recomputed in the backward), 4 with ATen's two ops.
  double swiglu_kept;
  // activation_checkpointing.cpu_checkpointing on a GPU: checkpointed inputs wait on the host.
  bool checkpoints_on_host = false;
};
Shape shape_of(const Config& c, int64_t micro_batch, const PlanOptions& opt);

// Whether our CUDA kernels run (the fused SwiGLU, the 8-bit AdamW step): a GPU run, a build that
// has them, and moe.kernels not `reference` (the model's own rule; activations_tier.cpp).
bool fused_kernels(const Config& c, const PlanOptions& opt);

// What LoRA's adapters keep for the backward (lora_tier.cpp): in an attention block, in a
// multi-head latent attention block, in an FFN (dense or MoE).
double lora_attention_saved(const Config& c, const Shape& s);
double lora_latent_attention_saved(const Config& c, const Shape& s);
double lora_ffn_saved(const Config& c, const Shape& s, bool moe_layer);

// Values of the routed experts held by other ranks under expert parallelism (parallel_tier.cpp).
double held_on_other_ranks(const Config& c, const DataParallelMode& dp);

}  // namespace moe::plan
