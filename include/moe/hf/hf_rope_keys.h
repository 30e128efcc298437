// The rotary settings of a Hugging Face config.json: rope_parameters (transformers 5) or
// rope_theta + rope_scaling (4.x), read as transformers reads them. Rope types default, linear
// and yarn are what our attention computes.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/families/hf_keys.h"

namespace moe::hf {

struct RopeSettings {
  double theta;
  nlohmann::json scaling;  // our model.rope_scaling (null: default)
  double partial_rotary_factor = 1.0;
};

// partial_default: the family's partial_rotary_factor when config.json has none (GLM-4.5's
// config sets 0.5); 0 = the family rotates every dimension and refuses another factor.
// `warnings` (may be null) gets the dict's keys the rope type does not read.
RopeSettings rope_settings(const families::HfKeys& k, double family_default, double partial_default,
                           std::vector<std::string>* warnings);

}  // namespace moe::hf
