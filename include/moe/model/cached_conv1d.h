// The causal conv1d + SiLU of the linear mixers (Gated DeltaNet, Mamba-2) during generation: the
// new inputs continue from the last K - 1 inputs the layer's cache holds, which it then replaces.
#pragma once

#include <torch/types.h>

#include "moe/model/decode_cache.h"

namespace moe::model {

// x [B, S, C] after cache.conv [B, K - 1, C] (undefined: zeros); weight [C, 1, K], bias [C] or
// undefined. Returns [B, S, C]; cache.conv holds the last K - 1 inputs afterwards.
torch::Tensor cached_causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                        const torch::Tensor& bias, LayerCache& cache);

}  // namespace moe::model
