#include "moe/families/latent_attention_keys.h"

namespace moe::families {

void read_latent_attention(const HfKeys& k, nlohmann::json& m, const LatentDefaults& d) {
  const int64_t heads = k.integer("num_attention_heads");
  if (k.integer("num_key_value_heads", heads) != heads) {
    k.fail("num_key_value_heads",
           "must equal num_attention_heads: latent attention gives every head its own keys");
  }
  m["num_key_value_heads"] = 0;
  m["head_dim"] = 0;  // transformers' head_dim here is qk_rope_head_dim, the rotary width
  m["kv_lora_rank"] = k.integer("kv_lora_rank", d.kv_lora_rank);
  if (m["kv_lora_rank"].get<int64_t>() == 0) k.fail("kv_lora_rank", "expected a positive integer");
  m["q_lora_rank"] = k.has("q_lora_rank") ? k.integer("q_lora_rank", 0) : d.q_lora_rank;
  m["qk_nope_head_dim"] = k.integer("qk_nope_head_dim", d.qk_nope_head_dim);
  m["qk_rope_head_dim"] = k.integer("qk_rope_head_dim", d.qk_rope_head_dim);
  m["v_head_dim"] = k.integer("v_head_dim", d.v_head_dim);
  m["rope_interleave"] = d.reads_rope_interleave ? k.boolean("rope_interleave", true) : true;
  m["qk_norm"] = false;
}

void write_latent_attention(const config::ModelConfig& m, nlohmann::json& j) {
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["q_lora_rank"] = m.q_lora_rank > 0 ? nlohmann::json(m.q_lora_rank) : nlohmann::json(nullptr);
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["attention_bias"] = false;
  j.erase("head_dim");  // the classes derive both (qk_rope_head_dim; nope + rope)
  j.erase("qk_head_dim");
}

}  // namespace moe::families
