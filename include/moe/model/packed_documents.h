#pragma once
// Packed documents for the linear mixers (Gated DeltaNet, Mamba-2): their scans carry a state
// across positions, so each must restart where a new document begins (position id 0).

#include <cstdint>

#include <torch/types.h>

namespace moe::model {

// Document ids [B, S] int64: a new one at every position 0 (all 0 without position ids).
inline torch::Tensor document_ids(const torch::Tensor& positions, int64_t B, int64_t S,
                                  const torch::Device& device) {
  if (!positions.defined()) return torch::zeros({B, S}, torch::dtype(torch::kLong).device(device));
  return positions.eq(0).to(torch::kLong).cumsum(1);
}

}  // namespace moe::model
