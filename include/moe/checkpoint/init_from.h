// model.init_from: a new run starts from existing weights (the fine-tuning step of the seed
// guide) - a moe-train checkpoint or a Hugging Face model directory. Optimizer and schedule
// start fresh; the architecture must be the config's.
#pragma once

#include <string>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::checkpoint {

// Loads cfg.model.init_from into `model`; returns what it was ("moe-train checkpoint" or the
// HF architecture name). UserError naming the key, directory or tensor when it does not fit.
std::string init_weights_from(const config::Config& cfg, model::TransformerLM& model);

// LoRA: puts the frozen base in place and records its fingerprint on the model: the weights of
// cfg.model.init_from, or without one the seeded random initialisation of cfg (`seeded`: the
// model was just built under torch::manual_seed(cfg.training.seed), so it already holds it).
void load_lora_base(const config::Config& cfg, model::TransformerLM& model, bool seeded);

}  // namespace moe::checkpoint
