// Which config keys are the model's architecture: the `model` and `moe` keys that a checkpoint's
// tensors depend on (or that change its function), as opposed to training and evaluation
// settings. Used wherever weights meet a config: eval, generate, model.init_from.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"

namespace moe::config {

// Whether `key` ("model.dropout") may differ between a checkpoint and the config that uses it.
bool is_training_setting(const std::string& key, const nlohmann::json& sections);

// Throws UserError naming the first architecture key whose value in `cfg` contradicts
// `sections` ({"model": {...}, "moe": {...}}, e.g. a checkpoint's saved config), saying where
// the other value comes from (`source`).
void check_same_architecture(const Config& cfg, const nlohmann::json& sections,
                             const std::string& source);

// `root` (a config document being loaded) with every architecture key it does not set taken
// from `sections`: eval and generate take the architecture from the checkpoint.
void fill_architecture(nlohmann::json& root, const nlohmann::json& sections);

// eval: a LoRA checkpoint's adapters come with it. When `root` has no lora section, the saved
// config's (`saved`, a checkpoint's whole config) is taken when it trains adapters (lora.r > 0);
// a lora section the config sets itself is left as it is (the loader checks it against the
// checkpoint). The saved quantization section (a 4-bit base) comes with the adapters likewise.
void fill_adapters(nlohmann::json& root, const nlohmann::json& saved);

// The first leaf where two config documents differ, as "path = A vs B" ("" when equal).
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace moe::config
