// moe.offload_experts for one run: `auto` settled before the model is built, and what the ring
// did, said at the end.
#pragma once

#include <spdlog/logger.h>
#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::train {

// The config with moe.offload_experts `auto` replaced by on or off: on for a LoRA run on a GPU
// where `moe-train plan` (against this device's memory) says the run does not fit with every
// expert on the device and the tier makes it fit or need less; off otherwise (a CPU run too).
config::Config settle_expert_offload(const config::Config& cfg, const torch::Device& device,
                                     spdlog::logger& log);

// The ring's counters in the log, with its largest device footprint against what it was planned
// to hold (offload_ring_layers of the largest layer): a footprint above it is a bug, and stops
// the run with an error.
void report_expert_offload(const model::TransformerLM& model, spdlog::logger& log);

}  // namespace moe::train
