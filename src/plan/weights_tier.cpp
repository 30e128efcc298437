// The weights tier: the trained weights (fp32, or 16-bit working weights), autocast's 16-bit
// copies, the gradients, master weights and Adam's moments on the device, and what the update
// allocates beyond its states. The offload tier moves the optimizer's share to the host.
#include "moe/plan/weights_tier.h"

#include <algorithm>
#include <string>

#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "plan_parts.h"

namespace moe::plan {

namespace {

// Values of the largest parameter the optimizer updates (a LoRA run: the largest adapter).
double largest_trained_parameter(const Config& c) {
  double largest = 0;
  for (const auto& p : config::parameter_layout(c)) {
    if (config::lora_enabled(c) && p.name.find("lora_") == std::string::npos) continue;
    double n = 1;
    for (int64_t d : p.shape) n *= static_cast<double>(d);
    largest = std::max(largest, n);
  }
  return largest;
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

}  // namespace

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

// fp32 weights (they are the master copy), fp32 gradients and Adam's two fp32 moments; or 16-bit
// working weights with 16-bit gradients (summed in fp32 over micro-batches) and fp32 masters (a
// bf16 master's compensation). ZeRO shares gradients (stage 2) and states (stage 1+) out.
void add_weights_and_states(const PlanContext& x, PlanDraft& d) {
  const Config& c = x.c;
  const PlanBasis& b = x.b;
  MemoryPlan& p = d.plan;
  const double N = b.N, trained = b.trained, sharded = b.sharded;
  const DataParallelMode& dp = b.dp;
  p.gradients = (b.streamed && b.w16     ? 0
                 : !b.w16 || b.fp32_sums ? 4
                                         : 2) *
                (dp.shards_gradients() ? sharded / N : trained);
  p.optimizer_states =
      moment_bytes_per_parameter(c) * (dp.shards_optimizer() ? sharded / N : trained);
  p.master_weights = !b.w16 ? 0 : (b.kahan ? 2 : 4) * trained;
  p.update_transient = update_transient_bytes(c, x.opt, trained);
  d.update_on_device = p.update_transient;
  // The trained weights (the LoRA part adds the frozen base).
  p.weights = (b.w16 ? 2 : 4) * trained;
  // Autocast keeps the bf16/fp16 copy of every fp32 matmul weight from the forward to the end of
  // the backward (its cache is cleared after the step); 16-bit weights need none.
  p.low_precision_weights = b.mixed && !b.w16 ? 2 * trained : 0;
}

}  // namespace moe::plan
