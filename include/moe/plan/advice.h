// The verdict and advice of the memory plan (src/plan/advice.cpp): whether a plan fits the
// device (and host), the largest micro-batch that does, what would make it fit, and the memory
// tiers (precision, offload, checkpointing) that `moe-train plan` tries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"
#include "moe/plan/memory_plan.h"

namespace moe::plan {

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
void apply_tier(const MemoryTier& t, config::Config& c, PlanOptions& o);

// The largest model of c's family (its width, experts and heads) that fits, by the number of
// layers: 0 layers when even one does not fit.
struct LargestModel {
  int64_t num_layers = 0, parameters = 0;
  double reserved = 0, host = 0;
};
LargestModel largest_fitting_model(const config::Config& c, const PlanOptions& opt);

// Whether `p` fits opt.device_bytes, the largest micro-batch that does, and what would make a
// config that does not fit fit (each change tried alone on a copy): p's verdict fields.
void fit_and_advise(const config::Config& c, const PlanOptions& opt, MemoryPlan& p);

}  // namespace moe::plan
