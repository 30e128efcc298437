// The Hugging Face side of a model's architecture: which of the supported families a
// config.json describes, its translation into our `model`/`moe` config sections, and back.
// Supported: MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM (docs/hf.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"

namespace moe::hf {

enum class Family { kMixtral, kQwen3Moe, kOlmoe, kGptOss, kGlm4Moe, kDeepseekV2, kDeepseekV3 };

// DeepSeek-V2 / V3 (Kimi, Moonlight): multi-head latent attention.
inline bool deepseek(Family f) { return f == Family::kDeepseekV2 || f == Family::kDeepseekV3; }
// The families whose MoE layers hold an `e_score_correction_bias` (GLM-4.5, DeepSeek-V3).
inline bool has_correction_bias(Family f) {
  return f == Family::kGlm4Moe || f == Family::kDeepseekV3;
}
// The families with shared experts, dense first layers (first_k_dense_replace), a router kept in
// fp32 (transformers' _keep_in_fp32_modules_strict) and multi-token-prediction layers past
// num_hidden_layers in their released weights.
inline bool deepseek_layout(Family f) { return f == Family::kGlm4Moe || deepseek(f); }

// model.seq_len of an import when max_position_embeddings is longer (with a warning): the run
// config's model.seq_len overrides it; exports keep the model's max_position_embeddings.
constexpr int64_t kImportSeqLenCap = 2048;

const char* architecture_name(Family f);  // "MixtralForCausalLM", ...
const char* model_type(Family f);         // "mixtral", "qwen3_moe", "olmoe"
// The family named `architecture` ("MixtralForCausalLM" or "mixtral"); UserError listing the
// supported ones otherwise. `where` prefixes the message.
Family parse_family(const std::string& architecture, const std::string& where);

// config.json (`hf_config`, read from `file`) -> {"model": {...}, "moe": {...}} in our keys.
// Anything we cannot represent exactly (another activation, attention biases, a sliding window,
// a rope type other than default/linear/yarn, ...) is a UserError naming the file and key.
// `warnings` gets the HF settings that only affect HF's own training (router jitter).
nlohmann::json architecture_from_hf(const nlohmann::json& hf_config, const std::string& file,
                                    Family* family, std::vector<std::string>* warnings);

// The family our architecture maps to: `requested` ("" = infer from the q/k norm layout), with a
// UserError "KEY: why" naming the first key that family cannot represent.
Family export_family(const config::Config& cfg, const std::string& requested);

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
nlohmann::json hf_config_from(const config::Config& cfg, Family family, const nlohmann::json& base,
                              const std::string& dtype,
                              std::vector<std::string>* warnings = nullptr);

}  // namespace moe::hf
