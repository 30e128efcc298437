// Will it fit? The memory a training step needs on one device, from the config alone (no
// LibTorch): parameters, the bytes per parameter of weights, gradients and Adam states under
// the config's precision, offload and ZeRO stage, and the activations autograd keeps per
// micro-batch (attention, router, dispatched rows, expert intermediates, head), walked through
// the backward pass layer by layer to find the peak. docs/memory.md derives every term;
// `moe-train plan` prints it; tests/train/memory_plan_test.py checks it against measured peaks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"

namespace moe::config {

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
};

// Bytes per parameter of Adam's two moments under optimizer.exp_avg_dtype / exp_avg_sq_dtype:
// 4 (fp32), 2 (bf16) or 1 + 4/256 (8-bit codes and one fp32 scale per 256-value block) each.
// Parameters under 4096 values keep fp32 moments under 8-bit; the planner counts them as 8-bit.
double moment_bytes_per_parameter(const Config& c);

// Bytes bitsandbytes' 4-bit format holds for one matrix of `values` values (quant/bnb_4bit.h,
// Quantized4bit::bytes()): ceil(values / 2) bytes of codes and one absmax per 64-value block,
// fp32; under double quant the absmax is one byte, with an fp32 scale per 256 blocks and one
// fp32 offset per matrix.
double quantized_4bit_bytes(int64_t values, bool double_quant);

// The frozen base a QLoRA run (quantization.load_in_4bit) holds in 4 bits, as the model quantizes
// it (layers/frozen_4bit.h): q, k, v and o of each attention, the dense MLPs' gate, up and down,
// and each routed expert's gate, up and down matrix, every one its own matrix; modules trained
// in full (lora.modules_to_save) stay as they are. All zero without load_in_4bit.
struct Quantized4bitBase {
  int64_t parameters = 0;  // values held in 4 bits
  int64_t matrices = 0;    // bitsandbytes matrices (each with its own blocks)
  double bytes = 0;        // codes + statistics, the exact sum over the matrices
  // Values of the largest matrix group dequantized at once before a GEMM (a fused q|k|v, an
  // output projection, a dense MLP projection, a layer's whole expert stack on the grouped-GEMM
  // path or one expert's matrix otherwise), and its bytes in the dtype it is dequantized to.
  double largest_group_values = 0, largest_group_bytes = 0;
};
Quantized4bitBase quantized_4bit_base(const Config& c, const PlanOptions& opt);

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
  double host = 0;      // host memory for offloaded states
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

// One combination of the memory tiers, with the settings that select it.
struct MemoryTier {
  std::string name;      // e.g. "bf16 weights + 8-bit moments + offload"
  std::string settings;  // the config keys that select it, "key=value ..."
  int cost = 0;          // ranks speed and precision given up: checkpointing 1, bf16 weights 1,
                         // bf16 moments 1, 8-bit moments 2, bf16 master 2, offload 3 (4 when
                         // its gradients are copied after the backward)
  int weights = 0;       // 0 fp32, 1 bf16 + fp32 master, 2 bf16 + bf16 master (Kahan)
  int moments = 0;       // 0 fp32, 1 bf16, 2 8-bit
  bool offload = false, checkpointing = false;
  // Offload's gradients copied after the backward (overlap_comm false): slower (cost +1) but
  // 4 B per parameter less host memory with 16-bit weights (no fp32 host gradients).
  bool offload_after_backward = false;
};
// Every combination, cheapest first (ties: in enumeration order).
std::vector<MemoryTier> memory_tiers();
// `c` with tier t applied (device plans: 16-bit tiers enable bf16 unless fp16 is on).
void apply_tier(const MemoryTier& t, Config& c, PlanOptions& o);

// The largest model of c's family (its width, experts and heads) that fits, by the number of
// layers: 0 layers when even one does not fit.
struct LargestModel {
  int64_t num_layers = 0, parameters = 0;
  double reserved = 0, host = 0;
};
LargestModel largest_fitting_model(const Config& c, const PlanOptions& opt);

MemoryPlan plan_memory(const Config& cfg, const PlanOptions& opt);

// The table and verdict as `moe-train plan` prints them.
std::string format_plan(const Config& cfg, const PlanOptions& opt, const MemoryPlan& p);

// "141GiB", "80GB", "24 GiB", "1e9" -> bytes; UserError naming `what` otherwise.
double parse_memory_size(const std::string& text, const std::string& what);

}  // namespace moe::config
