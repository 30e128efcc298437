// Layer rules several families share: which layers are dense, read from config.json and checked
// on export.
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

}  // namespace moe::families
