// The config.json keys of multi-head latent attention that DeepSeek-V2/V3, GLM-4.7-Flash and
// Mistral Small 4 share (kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
// v_head_dim, rope_interleave), read into our `model` section and written back.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/families/hf_keys.h"

namespace moe::families {

// A config class's defaults for the keys config.json leaves out.
struct LatentDefaults {
  int64_t kv_lora_rank = 512;
  int64_t q_lora_rank = 1536;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  bool reads_rope_interleave = true;  // false: always interleaved (DeepSeek-V2's complex form)
};

// The keys into `m` (num_key_value_heads must equal num_attention_heads: UserError otherwise).
void read_latent_attention(const HfKeys& k, nlohmann::json& m, const LatentDefaults& d);

// Our latent attention as config.json keys (head_dim and qk_head_dim left to the config class).
void write_latent_attention(const config::ModelConfig& m, nlohmann::json& j);

}  // namespace moe::families
