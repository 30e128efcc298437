#include "moe/hf/hf_tensor_map.h"

#include <functional>

#include <torch/torch.h>

#include "moe/util/errors.h"
#include "moe/util/safetensors_dtype.h"

namespace moe::hf {

namespace {

// The fused q/k/v attention: q_proj, k_proj and v_proj are row ranges of our qkv.
void attention_pieces(std::vector<TensorPiece>& p, const config::Config& cfg,
                      const std::string& layer_hf, const std::string& ours, int64_t layer,
                      const families::ModelFamily& family) {
  // "self_attn.q_proj..." below under the family's attention module ("mixer." for Nemotron-H).
  const std::string hf = layer_hf + family.attention_module();
  const auto& m = cfg.model;
  const int64_t H = m.num_heads, KV = config::layer_key_value_heads(cfg, layer);
  const int64_t hd = config::layer_head_dim(cfg, layer);
  const bool v_proj = !config::keys_are_values(cfg, layer);  // Gemma 4's K=V layers have none
  // Gated attention: q_proj's rows are per head the query and its gate, ours in the same order.
  const int64_t q = (m.attention_output_gate ? 2 : 1) * H * hd;
  p.push_back({hf + "q_proj.weight", ours + "attn.qkv.weight", -1, 0, q});
  p.push_back({hf + "k_proj.weight", ours + "attn.qkv.weight", -1, q, KV * hd});
  if (v_proj) {
    p.push_back({hf + "v_proj.weight", ours + "attn.qkv.weight", -1, q + KV * hd, KV * hd});
  }
  if (m.attention_bias || m.qkv_bias) {
    p.push_back({hf + "q_proj.bias", ours + "attn.qkv.bias", -1, 0, q});
    p.push_back({hf + "k_proj.bias", ours + "attn.qkv.bias", -1, q, KV * hd});
    p.push_back({hf + "v_proj.bias", ours + "attn.qkv.bias", -1, q + KV * hd, KV * hd});
  }
  p.push_back({hf + "o_proj.weight", ours + "attn.out.weight"});
  if (m.attention_bias) p.push_back({hf + "o_proj.bias", ours + "attn.out.bias"});
  if (m.attention_sinks) p.push_back({hf + "sinks", ours + "attn.sinks"});
  if (m.qk_norm) {
    p.push_back({hf + "q_norm.weight", ours + "attn.q_norm.weight"});
    p.push_back({hf + "k_norm.weight", ours + "attn.k_norm.weight"});
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

// Mamba-2: transformers' names are ours (model/mamba2_mixer.h), one tensor each.
void mamba_pieces(std::vector<TensorPiece>& p, const config::Config& cfg, const std::string& hf,
                  const std::string& ours) {
  const auto& m = cfg.model;
  std::vector<const char*> names = {"in_proj.weight", "conv1d.weight",  "dt_bias", "A_log", "D",
                                    "norm.weight",    "out_proj.weight"};
  if (m.mamba_conv_bias) names.push_back("conv1d.bias");
  if (m.mamba_proj_bias) names.insert(names.end(), {"in_proj.bias", "out_proj.bias"});
  for (const char* n : names) p.push_back({hf + n, ours + "mamba." + n});
}

// Gated DeltaNet: transformers' names are ours (model/gated_deltanet.h), one tensor each.
void linear_attention_pieces(std::vector<TensorPiece>& p, const config::Config& cfg,
                             const std::string& hf, const std::string& ours) {
  std::vector<const char*> names = {"conv1d.weight", "dt_bias", "A_log", "norm.weight",
                                    "out_proj.weight"};
  if (cfg.model.linear_fused_projections) {
    names.insert(names.begin(), {"in_proj_qkvz.weight", "in_proj_ba.weight"});
  } else {
    names.insert(names.begin(), {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight",
                                 "in_proj_a.weight"});
  }
  for (const char* n : names) {
    p.push_back({hf + "linear_attn." + n, ours + "linear_attn." + n});
  }
}

// The block's norms after the attention's input norm (and its scalar): the feed-forward's norm,
// or with sandwich norms transformers' Gemma names: post_attention_layernorm is the attention
// output's, pre_/post_feedforward_layernorm the feed-forward's, and beside the experts' _2 the
// dense branch's pre_feedforward_layernorm and post_feedforward_layernorm_1.
void block_norm_pieces(std::vector<TensorPiece>& p, const config::Config& cfg,
                       const std::string& hf, const std::string& ours, bool parallel) {
  const auto norm = [&](const std::string& theirs, const std::string& mine) {
    p.push_back({hf + theirs + ".weight", ours + mine + ".weight"});
  };
  if (cfg.model.layer_scalar) p.push_back({hf + "layer_scalar", ours + "layer_scalar"});
  if (!cfg.model.sandwich_norms) {
    norm("post_attention_layernorm", "moe_norm");
    return;
  }
  norm("post_attention_layernorm", "attn_post_norm");
  norm("post_feedforward_layernorm", "ffn_post_norm");
  if (!parallel) {
    norm("pre_feedforward_layernorm", "moe_norm");
    return;
  }
  norm("pre_feedforward_layernorm", "mlp_norm");
  norm("post_feedforward_layernorm_1", "mlp_post_norm");
  norm("pre_feedforward_layernorm_2", "moe_norm");
  norm("post_feedforward_layernorm_2", "moe_post_norm");
}

}  // namespace

std::vector<TensorPiece> tensor_pieces(const config::Config& cfg,
                                       const families::ModelFamily& family) {
  const auto& m = cfg.model;
  std::vector<TensorPiece> p;
  const std::string model = family.hf_model_prefix();  // "model." or "model.language_model."
  p.push_back({model + family.embedding_tensor(), "embed.weight"});
  for (int64_t i = 0; i < m.num_layers; ++i) {
    const std::string hf = model + "layers." + std::to_string(i) + ".";
    const std::string ours = "blocks." + std::to_string(i) + ".";
    const std::string input_norm = hf + family.input_norm() + ".weight";
    if (config::has_mixer(cfg, i)) {
      p.push_back({input_norm, ours + "attn_norm.weight"});
      if (config::linear_attention_layer(cfg, i)) {
        linear_attention_pieces(p, cfg, hf, ours);
      } else if (config::mamba_layer(cfg, i)) {
        mamba_pieces(p, cfg, hf + family.mamba_module(), ours);
      } else if (config::latent_attention(cfg)) {
        latent_attention_pieces(p, hf, ours, cfg.model.q_lora_rank > 0);
      } else {
        attention_pieces(p, cfg, hf, ours, i, family);
      }
    }
    if (!config::has_feed_forward(cfg, i)) continue;
    const bool moe = config::is_moe_layer(cfg, i), parallel = moe && cfg.moe.parallel_dense;
    if (m.sublayer_blocks) {
      p.push_back({input_norm, ours + "moe_norm.weight"});  // the sublayer's one norm
    } else {
      block_norm_pieces(p, cfg, hf, ours, parallel);
    }
    if (!moe || parallel) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        if (!config::gated_mlp(cfg) && std::string(proj) == "gate_proj") continue;
        p.push_back(
            {hf + family.dense_mlp_module() + proj + ".weight", ours + "mlp." + proj + ".weight"});
      }
    }
    if (moe) family.moe_tensors(cfg, hf, ours, p);
  }
  p.push_back({model + family.final_norm_tensor(), "final_norm.weight"});
  if (!m.tie_embeddings) p.push_back({family.hf_head_name(), "lm_head.weight"});
  return p;
}

torch::Tensor hf_part(const TensorPiece& piece, const torch::Tensor& hf) {
  torch::Tensor t = hf;
  if (piece.hf_rows >= 0) t = t.narrow(-2, piece.hf_row_begin, piece.hf_rows);
  if (piece.hf_step == 1) return t;
  return t.slice(-1, piece.hf_first, std::nullopt, piece.hf_step);
}

std::vector<TensorPiece> with_fused_experts(const std::vector<TensorPiece>& pieces,
                                            int64_t expert_hidden,
                                            const std::function<bool(const std::string&)>& has) {
  // "<block>experts.<e>.<proj>.weight" -> "<block>experts."
  const auto stack_of = [](const TensorPiece& p) -> std::string {
    if (p.expert < 0) return "";
    const auto at = p.hf.rfind("experts.");
    return at == std::string::npos ? "" : p.hf.substr(0, at + 8);
  };
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::vector<TensorPiece> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string stack = stack_of(pieces[i]);
    if (stack.empty() || !has(stack + "gate_up_proj") || has(pieces[i].hf)) {
      out.push_back(pieces[i]);
      continue;
    }
    // The stack's per-expert pieces, in a row: their gate / up / down parameters of ours.
    std::string gate, up, down;
    size_t j = i;
    for (; j < pieces.size() && stack_of(pieces[j]) == stack; ++j) {
      const std::string& ours = pieces[j].ours;
      if (ends_with(ours, "w_gate")) gate = ours;
      if (ends_with(ours, "w_up")) up = ours;
      if (ends_with(ours, "w_down")) down = ours;
    }
    i = j - 1;
    if (gate.empty() || up.empty() || down.empty()) {
      throw std::logic_error("hf tensor map: " + stack + " has no gate/up/down experts of ours");
    }
    TensorPiece g{stack + "gate_up_proj", gate};
    g.transpose = true;  // ours [E, d, f], transformers' [E, f, d]
    g.hf_rows = expert_hidden, g.hf_rows_total = 2 * expert_hidden;
    TensorPiece u = g;
    u.ours = up, u.hf_row_begin = expert_hidden;
    TensorPiece dn{stack + "down_proj", down};
    dn.transpose = true;
    out.push_back(g), out.push_back(u), out.push_back(dn);
  }
  return out;
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
  if (piece.transpose) t = t.transpose(-1, -2);
  if (piece.hf_leading_one) t = t.unsqueeze(0);
  return t;
}

torch::Tensor read_hf_tensor(const HfTensorRef& ref) {
  const SafeTensorEntry& e = *ref.entry;
  auto t = torch::from_blob(const_cast<char*>(ref.file->data(e)), e.shape,
                            torch::TensorOptions().dtype(*scalar_type_of_safetensors(e.dtype)))
               .clone();
  ref.file->release(e);
  return t;
}

}  // namespace moe::hf
