// The MoE feed-forward kind: the block's "moe" module (moe/moe_layer.h) built from the config's
// `moe` section.
#pragma once

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/moe/moe_layer.h"

namespace moe::model {

// The MoE layer's options from `cfg` (router, experts, LoRA on the experts, kernel path for
// `device`, expert parallelism).
moe::MoeLayerOptions moe_options(const config::Config& cfg, const torch::Device& device,
                                 const moe::MoeParallel& parallel);

}  // namespace moe::model
