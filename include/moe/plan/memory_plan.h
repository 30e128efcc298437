// Will it fit? The memory a training step needs on one device, from the config alone (no
// LibTorch): parameters, the bytes per parameter of weights, gradients and Adam states under
// the config's precision, offload and ZeRO stage, and the activations autograd keeps per
// micro-batch (attention, router, dispatched rows, expert intermediates, head), walked through
// the backward pass layer by layer to find the peak. docs/memory.md derives every term;
// `moe-train plan` prints it; tests/train/memory_plan_test.py checks it against measured peaks.
//
// The planner is a list of parts, one per memory tier (src/plan/memory_plan.cpp): weights,
// gradients and optimizer states (weights_tier.h), the 4-bit base (quantized_base_tier.h), LoRA's
// frozen base, data and expert parallelism, activations, offload; then the peak, the verdict and
// advice (advice.h) and the report (plan_report.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"

namespace moe::plan {

struct PlanOptions {
  int64_t world_size = 1;      // data-parallel ranks (ZeRO divides states by it)
  double device_bytes = 0;     // memory of one device; 0 = no verdict
  double host_bytes = 0;       // host memory for offloaded states; 0 = not checked
  bool cpu = false;            // planning a CPU run (no CUDA context, no allocator rounding)
  int64_t micro_batch = 0;     // 0 = the config's train_micro_batch_size_per_gpu
  bool checkpointing = false;  // force activation checkpointing of every block
  // Our CUDA kernels are in the build (kernels::cuda_kernels_compiled()); without them a GPU run
  // takes the ATen references (the SwiGLU keeps silu(gate) too, the 8-bit step its copies).
  bool cuda_kernels = true;
  // Host-to-device bandwidth of pinned memory in bytes/s (`moe-train env` measures it on a GPU
  // machine); 0 = the plan assumes PCIe 4.0 x16's ~25 GB/s.
  double host_link_bytes_per_s = 0;
};

// The expert offload tier (moe.offload_experts): what moves to the host and over the link.
struct ExpertOffloadPlan {
  bool on = false;
  bool chosen_by_auto = false;     // moe.offload_experts auto turned it on (nothing else fits)
  int64_t layers = 0;              // MoE layers whose experts live on the host
  double host_bytes = 0;           // their frozen experts (16-bit stacks or 4-bit states)
  double ring_bytes = 0;           // the device ring: offload_ring_layers of the largest layer
  double copy_bytes_per_step = 0;  // host -> device per optimizer step
  double link_bytes_per_s = 0;     // the bandwidth the time below assumes
  double copy_seconds_per_step = 0;
};

struct MemoryPlan {
  int64_t parameters = 0, active_parameters = 0;
  int64_t micro_batch = 0;
  // Bytes on the device.
  double weights = 0, gradients = 0, optimizer_states = 0, low_precision_weights = 0;
  // 16-bit working weights: fp32 masters on the device (or a bf16 master's compensation).
  double master_weights = 0;
  // QLoRA (quantization.load_in_4bit): the part of `weights` held in 4 bits and its parameters,
  // and the dequantized copy a 4-bit GEMM reads (one group at a time, freed before the next).
  double quantized_base = 0;
  int64_t quantized_parameters = 0;
  double dequant_scratch = 0;
  double activations = 0;                // kept for the backward, one micro-batch, as configured
  double activations_no_checkpoint = 0;  // ... without activation checkpointing
  double activations_checkpoint = 0;     // ... with every block checkpointed
  double backward_transient = 0;         // the largest short-lived buffers of the backward
  double update_transient = 0;  // bf16 / 8-bit moments: fp32 copies for the largest parameter
  // Data parallel: gradient communication buffers alive in the backward (DDP's buckets, or
  // ZeRO-2's filling and in-flight buckets, or the after-backward all-reduce's one bucket).
  double communication = 0;
  double peak = 0;      // tensors at the worst moment of a step
  double reserved = 0;  // + the caching allocator and the CUDA context (GPU)
  // moe.offload_experts: the frozen experts moved out of `weights` to host memory (in `host`),
  // the device ring that replaces them, and the copies a step makes.
  ExpertOffloadPlan expert_offload;
  double host = 0;  // host memory for offloaded states
  // ... of which held for the whole run: moments, fp32 masters, gradient staging or streamed
  // gradients. Exactly what the offloaded optimizer allocates (FusedAdamW::host_bytes) for fp32
  // and bf16 moments; 8-bit moments count 1 + 4/256 B per value (small tensors keep fp32 ones).
  double host_states = 0;
  // Verdict (device_bytes > 0).
  bool fits = true;
  int64_t max_micro_batch = 0;      // the largest that fits as configured (0 = none)
  std::vector<std::string> advice;  // what would make it fit (or fit larger batches)
  // Where nothing tried fits: the closest options with what each needs (so a user of a model
  // far above one device, e.g. DeepSeek-V3, sees how far and why).
  std::vector<std::string> nearest;
  // The cheapest tier (precision of weights, master and moments; offload; checkpointing) that
  // fits the device (and host), as config settings; empty when none does.
  std::string cheapest_tier;
};

MemoryPlan plan_memory(const config::Config& cfg, const PlanOptions& opt);

}  // namespace moe::plan
