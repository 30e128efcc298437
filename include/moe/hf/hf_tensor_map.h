// The one table between our parameter names and a Hugging Face family's tensor names
// (families/tensor_piece.h): the common embeddings, norms, attention and dense MLPs here, each
// family's MoE tensors from its file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/families/model_family.h"
#include "moe/families/tensor_piece.h"
#include "moe/hf/hf_files.h"

namespace moe::hf {

using families::TensorPiece;

// In the order transformers writes a state dict: embeddings, layers, final norm, head.
std::vector<TensorPiece> tensor_pieces(const config::Config& cfg,
                                       const families::ModelFamily& family);

// `pieces` with each MoE layer's per-expert tensors replaced by the fused stacks where the
// checkpoint holds those instead (`has`: whether it has a tensor of that name): Qwen3.5's bf16
// releases save mlp.experts.gate_up_proj [E, 2f, d] (gate rows, then up) and down_proj [E, d, f],
// as transformers holds them in memory (expert_hidden: f).
std::vector<TensorPiece> with_fused_experts(const std::vector<TensorPiece>& pieces,
                                            int64_t expert_hidden,
                                            const std::function<bool(const std::string&)>& has);

// The part of the HF tensor `hf` that `piece` covers (a strided view where hf_step > 1).
torch::Tensor hf_part(const TensorPiece& piece, const torch::Tensor& hf);

// The view of `params[piece.ours]` that `piece.hf` corresponds to (writable: copy_ into it).
torch::Tensor piece_view(const TensorPiece& piece,
                         const std::map<std::string, torch::Tensor>& params);

// A tensor of an HF directory as a torch tensor of its own dtype: a copy of its bytes (safetensors
// data offsets need not be aligned for the element type), then its mapped pages released.
torch::Tensor read_hf_tensor(const HfTensorRef& ref);

}  // namespace moe::hf
