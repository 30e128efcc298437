// Layer rules several families share: which layers are dense, read from config.json and checked
// on export; the Mamba-2 families' time-step limits.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/families/hf_keys.h"

namespace moe::families {

// The leading dense layers, first_k_dense_replace (default `fallback`, the config class's), as
// our moe.mlp_only_layers list.
nlohmann::json first_k_dense_layers(const HfKeys& k, int64_t fallback);

// How many layers before the first MoE layer (what first_k_dense_replace writes).
int64_t leading_dense_layers(const config::Config& cfg);

// UserError unless the dense layers are exactly the leading ones (`who`: "GLM-4.5").
void require_dense_layers_first(const config::Config& cfg, const std::string& who);

// UserError("moe.mlp_only_layers: WHO has no dense layers") when a layer is dense.
void require_all_moe(const config::Config& cfg, const std::string& who);

// HF's time_step_limit [min, max] into model.mamba_dt_min / mamba_dt_max (max inf, as Python
// writes it (Infinity) or transformers 5 does ({"__float__": "Infinity"}), is our 0); absent:
// transformers' (0, inf).
void read_time_step_limit(const HfKeys& k, nlohmann::json& model);
// And back, inf as transformers 5 writes it.
nlohmann::json time_step_limit(const config::ModelConfig& m);

}  // namespace moe::families
