// The weights tier of the memory plan (src/plan/weights_tier.cpp): weights, gradients, master
// weights and Adam's moments on the device under the config's precision and ZeRO stage.
#pragma once

#include "moe/config/config.h"

namespace moe::plan {

// Bytes per parameter of Adam's two moments under optimizer.exp_avg_dtype / exp_avg_sq_dtype:
// 4 (fp32), 2 (bf16) or 1 + 4/256 (8-bit codes and one fp32 scale per 256-value block) each.
// Parameters under 4096 values keep fp32 moments under 8-bit; the planner counts them as 8-bit.
double moment_bytes_per_parameter(const config::Config& c);

}  // namespace moe::plan
