#include "moe/hf/hf_tensor_map.h"

#include <torch/torch.h>

#include "moe/util/errors.h"

namespace moe::hf {

std::vector<TensorPiece> tensor_pieces(const config::Config& cfg, Family family) {
  const auto& m = cfg.model;
  const int64_t H = m.num_heads, KV = config::key_value_heads(cfg), hd = config::head_dim(cfg);
  std::vector<TensorPiece> p;
  p.push_back({"model.embed_tokens.weight", "embed.weight"});
  const bool mixtral = family == Family::kMixtral;
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string ours = "blocks." + std::to_string(i) + ".";
    p.push_back({hf + "input_layernorm.weight", ours + "attn_norm.weight"});
    p.push_back({hf + "self_attn.q_proj.weight", ours + "attn.qkv.weight", -1, 0, H * hd});
    p.push_back({hf + "self_attn.k_proj.weight", ours + "attn.qkv.weight", -1, H * hd, KV * hd});
    p.push_back(
        {hf + "self_attn.v_proj.weight", ours + "attn.qkv.weight", -1, (H + KV) * hd, KV * hd});
    p.push_back({hf + "self_attn.o_proj.weight", ours + "attn.out.weight"});
    if (m.qk_norm) {
      p.push_back({hf + "self_attn.q_norm.weight", ours + "attn.q_norm.weight"});
      p.push_back({hf + "self_attn.k_norm.weight", ours + "attn.k_norm.weight"});
    }
    p.push_back({hf + "post_attention_layernorm.weight", ours + "moe_norm.weight"});
    if (!config::is_moe_layer(cfg, i)) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        p.push_back({hf + "mlp." + proj + ".weight", ours + "mlp." + proj + ".weight"});
      }
      continue;
    }
    const std::string block = hf + (mixtral ? "block_sparse_moe." : "mlp.");
    p.push_back({block + "gate.weight", ours + "moe.router.weight"});
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
