// model.attention_backend: which scaled-dot-product-attention kernel torch tries first on CUDA.
// Sets torch's process-wide SDPA priority order (at::Context::setSDPPriorityOrder, what
// torch.nn.attention.sdpa_kernel(..., set_priority=True) sets): the chosen kernel first, the
// others after it in torch's own order, so a shape the first cannot run still runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/choices.h"

namespace moe::model {

// The order `first` asks for, as at::SDPBackend values: it first, then `base` without it.
// kAuto: `base` unchanged.
std::vector<int64_t> attention_priority(config::AttentionBackend first,
                                        const std::vector<int64_t>& base);

// Sets the process's order from torch's own order (read once, before the first change), so
// that kAuto restores it after another setting.
void apply_attention_backend(config::AttentionBackend first);

// The order now in effect, e.g. "flash, efficient, math, cudnn, overrideable".
std::string attention_priority_names();

}  // namespace moe::model
