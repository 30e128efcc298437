// The one table between our parameter names and a Hugging Face family's tensor names
// (families/tensor_piece.h): the common embeddings, norms, attention and dense MLPs here, each
// family's MoE tensors from its file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/families/model_family.h"
#include "moe/families/tensor_piece.h"

namespace moe::hf {

using families::TensorPiece;

// In the order transformers writes a state dict: embeddings, layers, final norm, head.
std::vector<TensorPiece> tensor_pieces(const config::Config& cfg,
                                       const families::ModelFamily& family);

// The part of the HF tensor `hf` that `piece` covers (a strided view where hf_step > 1).
torch::Tensor hf_part(const TensorPiece& piece, const torch::Tensor& hf);

// The view of `params[piece.ours]` that `piece.hf` corresponds to (writable: copy_ into it).
torch::Tensor piece_view(const TensorPiece& piece,
                         const std::map<std::string, torch::Tensor>& params);

}  // namespace moe::hf
