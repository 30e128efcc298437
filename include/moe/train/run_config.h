// Loading the config of a run whose weights come from elsewhere (model.init_from, eval of a
// checkpoint): the architecture keys the file leaves out are taken from those weights, so a
// fine-tuning config names only what it changes. No LibTorch.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"

namespace moe::train {

// {"model": {...}, "moe": {...}} of a moe-train checkpoint (its saved config) or a Hugging Face
// directory (its config.json, mapped). UserError naming `dir` when it is neither.
nlohmann::json weights_architecture(const std::string& dir);

// data.reset_attention_at_eod without data.eod_id: the dataset's own (its manifest's eod_id).
void fill_eod_from_manifest(nlohmann::json& root);

// file -> overrides -> missing architecture keys from model.init_from (when set), and
// data.eod_id from the dataset's manifest when data.reset_attention_at_eod leaves it out ->
// typed -> validated. Otherwise exactly config::load.
// `world_size`: data-parallel ranks (the batch rule; parallel/launch_env.h).
config::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                               int64_t world_size = 1);

}  // namespace moe::train
