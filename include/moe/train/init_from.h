// model.init_from: a new run starts from existing weights (the fine-tuning step of the seed
// guide) - a moe-train checkpoint or a Hugging Face model directory. Optimizer and schedule
// start fresh; the architecture must be the config's.
#pragma once

#include <string>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::train {

// Loads cfg.model.init_from into `model`; returns what it was ("moe-train checkpoint" or the
// HF architecture name). UserError naming the key, directory or tensor when it does not fit.
std::string init_weights_from(const config::Config& cfg, model::TransformerLM& model);

}  // namespace moe::train
