#include "moe/hf/hf_tensor_map.h"

#include <torch/torch.h>

#include "moe/util/errors.h"

namespace moe::hf {

namespace {

// gpt-oss: whole [E, ...] stacks, gate and up interleaved in one tensor, biases everywhere.
void gpt_oss_experts(std::vector<TensorPiece>& p, const std::string& hf, const std::string& ours) {
  const std::string ex = hf + "mlp.experts.", mine = ours + "moe.experts.";
  p.push_back({hf + "mlp.router.weight", ours + "moe.router.weight"});
  p.push_back({hf + "mlp.router.bias", ours + "moe.router.bias"});
  p.push_back({ex + "gate_up_proj", mine + "w_gate", -1, 0, -1, false, 0, 2});
  p.push_back({ex + "gate_up_proj", mine + "w_up", -1, 0, -1, false, 1, 2});
  p.push_back({ex + "gate_up_proj_bias", mine + "b_gate", -1, 0, -1, false, 0, 2});
  p.push_back({ex + "gate_up_proj_bias", mine + "b_up", -1, 0, -1, false, 1, 2});
  p.push_back({ex + "down_proj", mine + "w_down"});
  p.push_back({ex + "down_proj_bias", mine + "b_down"});
}

// The fused q/k/v attention: q_proj, k_proj and v_proj are row ranges of our qkv.
void attention_pieces(std::vector<TensorPiece>& p, const config::Config& cfg, const std::string& hf,
                      const std::string& ours) {
  const auto& m = cfg.model;
  const int64_t H = m.num_heads, KV = config::key_value_heads(cfg), hd = config::head_dim(cfg);
  p.push_back({hf + "self_attn.q_proj.weight", ours + "attn.qkv.weight", -1, 0, H * hd});
  p.push_back({hf + "self_attn.k_proj.weight", ours + "attn.qkv.weight", -1, H * hd, KV * hd});
  p.push_back(
      {hf + "self_attn.v_proj.weight", ours + "attn.qkv.weight", -1, (H + KV) * hd, KV * hd});
  if (m.attention_bias || m.qkv_bias) {
    p.push_back({hf + "self_attn.q_proj.bias", ours + "attn.qkv.bias", -1, 0, H * hd});
    p.push_back({hf + "self_attn.k_proj.bias", ours + "attn.qkv.bias", -1, H * hd, KV * hd});
    p.push_back({hf + "self_attn.v_proj.bias", ours + "attn.qkv.bias", -1, (H + KV) * hd, KV * hd});
  }
  p.push_back({hf + "self_attn.o_proj.weight", ours + "attn.out.weight"});
  if (m.attention_bias) p.push_back({hf + "self_attn.o_proj.bias", ours + "attn.out.bias"});
  if (m.attention_sinks) p.push_back({hf + "self_attn.sinks", ours + "attn.sinks"});
  if (m.qk_norm) {
    p.push_back({hf + "self_attn.q_norm.weight", ours + "attn.q_norm.weight"});
    p.push_back({hf + "self_attn.k_norm.weight", ours + "attn.k_norm.weight"});
  }
}

// Multi-head latent attention (DeepSeek-V2/V3): one tensor each.
void latent_attention_pieces(std::vector<TensorPiece>& p, const std::string& hf,
                             const std::string& ours, bool q_lora) {
  const std::string a = hf + "self_attn.", mine = ours + "attn.";
  if (q_lora) {
    p.push_back({a + "q_a_proj.weight", mine + "q_a_proj.weight"});
    p.push_back({a + "q_a_layernorm.weight", mine + "q_a_norm.weight"});
    p.push_back({a + "q_b_proj.weight", mine + "q_b_proj.weight"});
  } else {
    p.push_back({a + "q_proj.weight", mine + "q_proj.weight"});
  }
  p.push_back({a + "kv_a_proj_with_mqa.weight", mine + "kv_a_proj.weight"});
  p.push_back({a + "kv_a_layernorm.weight", mine + "kv_a_norm.weight"});
  p.push_back({a + "kv_b_proj.weight", mine + "kv_b_proj.weight"});
  p.push_back({a + "o_proj.weight", mine + "out.weight"});
}

}  // namespace

std::vector<TensorPiece> tensor_pieces(const config::Config& cfg, Family family) {
  const auto& m = cfg.model;
  std::vector<TensorPiece> p;
  p.push_back({"model.embed_tokens.weight", "embed.weight"});
  const bool mixtral = family == Family::kMixtral;
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string ours = "blocks." + std::to_string(i) + ".";
    p.push_back({hf + "input_layernorm.weight", ours + "attn_norm.weight"});
    if (config::latent_attention(cfg)) {
      latent_attention_pieces(p, hf, ours, cfg.model.q_lora_rank > 0);
    } else {
      attention_pieces(p, cfg, hf, ours);
    }
    p.push_back({hf + "post_attention_layernorm.weight", ours + "moe_norm.weight"});
    if (!config::is_moe_layer(cfg, i)) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        p.push_back({hf + "mlp." + proj + ".weight", ours + "mlp." + proj + ".weight"});
      }
      continue;
    }
    if (family == Family::kGptOss) {
      gpt_oss_experts(p, hf, ours);
      continue;
    }
    const std::string block = hf + (mixtral ? "block_sparse_moe." : "mlp.");
    p.push_back({block + "gate.weight", ours + "moe.router.weight"});
    if (has_correction_bias(family)) {
      // The selection bias is a buffer of ours (moe.router.expert_bias), carried by state.json.
      p.push_back({block + "gate.e_score_correction_bias", ours + "moe.router.expert_bias"});
    }
    if (deepseek_layout(family) && cfg.moe.shared_expert_hidden_size > 0) {
      const std::string sh = block + "shared_experts.", mine = ours + "moe.shared_expert.";
      p.push_back({sh + "gate_proj.weight", mine + "w_gate", 0, 0, -1, true});
      p.push_back({sh + "up_proj.weight", mine + "w_up", 0, 0, -1, true});
      p.push_back({sh + "down_proj.weight", mine + "w_down", 0, 0, -1, true});
    }
    for (int64_t e = 0; e < cfg.moe.num_experts; ++e) {
      const std::string ex = block + "experts." + std::to_string(e) + ".";
      p.push_back({ex + (mixtral ? "w1" : "gate_proj") + ".weight", ours + "moe.experts.w_gate", e,
                   0, -1, true});
      p.push_back({ex + (mixtral ? "w2" : "down_proj") + ".weight", ours + "moe.experts.w_down", e,
                   0, -1, true});
      p.push_back({ex + (mixtral ? "w3" : "up_proj") + ".weight", ours + "moe.experts.w_up", e, 0,
                   -1, true});
    }
  }
  p.push_back({"model.norm.weight", "final_norm.weight"});
  if (!m.tie_embeddings) p.push_back({"lm_head.weight", "lm_head.weight"});
  return p;
}

torch::Tensor hf_part(const TensorPiece& piece, const torch::Tensor& hf) {
  if (piece.hf_step == 1) return hf;
  return hf.slice(-1, piece.hf_first, std::nullopt, piece.hf_step);
}

torch::Tensor piece_view(const TensorPiece& piece,
                         const std::map<std::string, torch::Tensor>& params) {
  auto it = params.find(piece.ours);
  if (it == params.end()) {
    throw std::logic_error("hf tensor map: the model has no parameter " + piece.ours);
  }
  torch::Tensor t = it->second;
  if (piece.expert >= 0) t = t.select(0, piece.expert);
  if (piece.rows >= 0) t = t.narrow(0, piece.row_begin, piece.rows);
  if (piece.transpose) t = t.t();
  return t;
}

}  // namespace moe::hf
