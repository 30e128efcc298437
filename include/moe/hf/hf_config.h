// The Hugging Face side of a model's architecture: the common config.json keys, read into our
// `model`/`moe` config sections and written back; what each family names its own way is its
// file's (families/model_family.h, src/families/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/families/model_family.h"

namespace moe::hf {

// model.seq_len of an import when max_position_embeddings is longer (with a warning): the run
// config's model.seq_len overrides it; exports keep the model's max_position_embeddings.
constexpr int64_t kImportSeqLenCap = 2048;

// config.json (`hf_config`, read from `file`) -> {"model": {...}, "moe": {...}} in our keys.
// Anything we cannot represent exactly (another activation, attention biases, a sliding window,
// a rope type other than default/linear/yarn, ...) is a UserError naming the file and key.
// `warnings` gets the HF settings that only affect HF's own training (router jitter).
// `family` (may be null) gets the family config.json names (architectures, or model_type).
nlohmann::json architecture_from_hf(const nlohmann::json& hf_config, const std::string& file,
                                    const families::ModelFamily** family,
                                    std::vector<std::string>* warnings);

// The family our architecture maps to: `requested` (an architecture or model_type; "" = the
// family that claims it most), with a UserError "KEY: why" naming the first key that family
// cannot represent.
const families::ModelFamily& export_family(const config::Config& cfg, const std::string& requested);

// model.rope_theta and model.rope_scaling as transformers 5's rope_parameters dict.
nlohmann::json rope_parameters(const config::ModelConfig& m);

// YaRN's scaled window, factor x original_max_position_embeddings: the max_position_embeddings
// an export writes (some transformers 4.x releases derive the factor from the two windows).
int64_t yarn_window(const config::RopeScalingConfig& s);

// The model.rope_scaling an HF config.json (`hf_config`, read from `file`) maps to.
config::RopeScalingConfig rope_scaling_of(const nlohmann::json& hf_config, const std::string& file);

// config.json for `cfg` in `family`'s layout. `base`: an original HF config of the model (from
// import-hf) whose other keys (token ids, max_position_embeddings, ...) are kept; may be null.
// `warnings` (may be null) gets what a loader of the result must know: a YaRN window that is not
// a whole factor x original, or one below the base's max_position_embeddings.
nlohmann::json hf_config_from(const config::Config& cfg, const families::ModelFamily& family,
                              const nlohmann::json& base, const std::string& dtype,
                              std::vector<std::string>* warnings = nullptr);

}  // namespace moe::hf
