// The memory plan, assembled: the basis every tier reads (what trains, stays frozen or lives on
// other ranks; the data-parallel layout; the dtypes), then the parts, one per memory tier, each
// adding its terms in turn, then the peak and what the allocator reserves, then (with a device
// size) the verdict and advice. A new tier is a new part: its file, and a line in kParts.
#include "moe/plan/memory_plan.h"

#include <algorithm>
#include <utility>

#include "moe/config/lora.h"
#include "moe/plan/advice.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

// The memory tiers, in the order they add their terms (a part may read what an earlier one set:
// the LoRA part the 4-bit base's bytes, the offload part the weights tier's states and the
// activations part's host bytes).
constexpr PlanPart kParts[] = {
    {"4-bit base", add_quantized_base},
    {"weights, gradients and optimizer states", add_weights_and_states},
    {"LoRA frozen base", add_lora_frozen_base},
    {"expert offload", add_expert_offload},
    {"data and expert parallelism", add_parallel},
    {"activations", add_activations},
    {"offload", add_offload},
};

PlanBasis plan_basis(const Config& c, const PlanOptions& opt, int64_t parameters) {
  const double P = static_cast<double>(parameters);
  const double N = static_cast<double>(std::max<int64_t>(1, opt.world_size));
  const bool offload = c.zero_optimization.offload_optimizer.device == OffloadDevice::kCpu;
  const bool mixed = !opt.cpu && (c.bf16.enabled || c.fp16.enabled);
  const DataParallelMode dp = config::data_parallel_mode(c, opt.world_size);
  // LoRA (config/lora.h): only the adapters and modules_to_save have gradients and Adam state;
  // the frozen base is fp32 on a CPU, the compute dtype (2 bytes) under bf16/fp16 on a GPU.
  const config::LoraParameterCounts lora = config::lora_parameter_counts(c);
  // Expert parallelism: a rank holds num_experts / EP of the routed experts, with their
  // gradients and Adam state (docs/distributed.md).
  const double held_elsewhere = held_on_other_ranks(c, dp);
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

// The worst moment of a step: the backward's peak with the communication buffers and the 4-bit
// scratch, or the optimizer step (every gradient, the clipping norms, the fused update with no
// temporaries or the reference update's fp32 copies on the device), on top of the states.
void add_peak(const PlanContext& x, PlanDraft& d) {
  MemoryPlan& p = d.plan;
  const double fixed = p.weights + p.optimizer_states + p.low_precision_weights + p.master_weights;
  const double step_peak =
      p.gradients + 8 * static_cast<double>(x.c.model.num_layers) * 64 + d.update_on_device;
  p.peak = fixed + std::max(d.backward_peak + p.communication + p.dequant_scratch, step_peak);
  // The caching allocator rounds and fragments (~5% measured by PyTorch users on LLM training);
  // the CUDA context and cuBLAS/cuDNN workspaces add about 0.5-1 GiB per process.
  p.reserved = x.opt.cpu ? p.peak : p.peak * 1.05 + 0.75 * kGiB;
}

// moe.offload_experts auto on a GPU with a device size: the run as configured if it fits, else
// with the experts offloaded if that fits (or at least needs less).
bool settles_offload_by_plan(const Config& c, const PlanOptions& opt) {
  return c.moe.offload_experts == config::OffloadExperts::kAuto && config::lora_enabled(c) &&
         !opt.cpu && opt.device_bytes > 0 && c.moe.num_experts > 1;
}

}  // namespace

MemoryPlan plan_memory(const Config& c, const PlanOptions& opt) {
  if (settles_offload_by_plan(c, opt)) {
    Config off = c, on = c;
    off.moe.offload_experts = config::OffloadExperts::kOff;
    on.moe.offload_experts = config::OffloadExperts::kOn;
    MemoryPlan without = plan_memory(off, opt);
    if (without.fits) return without;
    MemoryPlan with = plan_memory(on, opt);
    if (!with.expert_offload.on || (!with.fits && with.reserved >= without.reserved)) {
      return without;
    }
    with.expert_offload.chosen_by_auto = true;
    return with;
  }
  PlanDraft d;
  MemoryPlan& p = d.plan;
  p.parameters = config::count_parameters(c);
  p.active_parameters = config::active_parameters_per_token(c);
  p.micro_batch = opt.micro_batch > 0 ? opt.micro_batch : c.train_micro_batch_size_per_gpu;
  const PlanContext x{c, opt, plan_basis(c, opt, p.parameters)};
  for (const PlanPart& part : kParts) part.add(x, d);
  add_peak(x, d);
  if (opt.device_bytes > 0) fit_and_advise(c, opt, p);
  return std::move(d.plan);
}

}  // namespace moe::plan
