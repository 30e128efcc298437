#include "moe/families/model_family.h"

namespace moe::families {

void ModelFamily::moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                              const std::string& our_layer, std::vector<TensorPiece>& out) const {
  split_expert_tensors(cfg, hf_layer, our_layer, ExpertNames{}, out);
}

// Router, correction bias and shared experts where the family has them, then one tensor per
// expert and projection (transformers 5 saves MoE experts one by one; ours are stacked and
// transposed).
void ModelFamily::split_expert_tensors(const config::Config& cfg, const std::string& hf_layer,
                                       const std::string& our_layer, const ExpertNames& names,
                                       std::vector<TensorPiece>& out) const {
  const std::string block = hf_layer + names.block;
  const bool gated = config::gated_mlp(cfg);  // relu2 experts: up and down only
  out.push_back({block + "gate.weight", our_layer + "moe.router.weight"});
  if (has(Feature::kSelectionBias)) {
    // The selection bias is a buffer of ours (moe.router.expert_bias), carried by state.json.
    out.push_back({block + "gate.e_score_correction_bias", our_layer + "moe.router.expert_bias"});
  }
  if (has(Feature::kSharedExperts) && cfg.moe.shared_expert_hidden_size > 0) {
    const std::string sh = block + names.shared, mine = our_layer + "moe.shared_expert.";
    if (gated) out.push_back({sh + "gate_proj.weight", mine + "w_gate", 0, 0, -1, true});
    out.push_back({sh + "up_proj.weight", mine + "w_up", 0, 0, -1, true});
    out.push_back({sh + "down_proj.weight", mine + "w_down", 0, 0, -1, true});
    if (cfg.moe.shared_expert_gate) {
      out.push_back(
          {block + "shared_expert_gate.weight", our_layer + "moe.shared_expert_gate.weight"});
    }
  }
  const std::string mine = our_layer + "moe.experts.";
  for (int64_t e = 0; e < cfg.moe.num_experts; ++e) {
    const std::string ex = block + "experts." + std::to_string(e) + ".";
    if (gated) out.push_back({ex + names.gate + ".weight", mine + "w_gate", e, 0, -1, true});
    out.push_back({ex + names.down + ".weight", mine + "w_down", e, 0, -1, true});
    out.push_back({ex + names.up + ".weight", mine + "w_up", e, 0, -1, true});
  }
}

void ModelFamily::fused_expert_tensors(const config::Config& cfg, const std::string& experts,
                                       const std::string& our_layer,
                                       std::vector<TensorPiece>& out) {
  const std::string mine = our_layer + "moe.experts.";
  const int64_t f = config::expert_hidden_size(cfg);
  TensorPiece gate{experts + "gate_up_proj", mine + "w_gate"};
  gate.transpose = true;  // ours [E, d, f], theirs [E, f, d] (gate rows, then up rows)
  gate.hf_rows = f, gate.hf_rows_total = 2 * f;
  TensorPiece up = gate;
  up.ours = mine + "w_up", up.hf_row_begin = f;
  TensorPiece down{experts + "down_proj", mine + "w_down"};
  down.transpose = true;
  out.push_back(gate), out.push_back(up), out.push_back(down);
}

}  // namespace moe::families
