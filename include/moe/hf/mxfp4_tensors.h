// gpt-oss's released checkpoints store each layer's expert stacks in MXFP4: NAME_blocks (U8
// [E, rows, G, 16]) and NAME_scales (U8 [E, rows, G]) in place of NAME, the [E, rows, G * 32]
// matrix transposed to the parameter's [E, G * 32, rows] (transformers' Mxfp4 loading,
// convert_moe_packed_tensors). quantization_config.quant_method "mxfp4" says so in config.json;
// the tensors themselves are what this reads.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "moe/hf/hf_files.h"

namespace moe::hf {

// The parameter's shape when `name` is stored as MXFP4 in `w` (NAME_blocks present); nullopt
// otherwise. Blocks and scales that are not that layout (dtype, rank, a last dimension other
// than 16, scales not matching, a missing half) are a UserError naming the file and tensor.
std::optional<std::vector<int64_t>> mxfp4_shape(const HfWeights& w, const std::string& name);

// The dequantized parameter [E, G * 32, rows] in `dtype` (mxfp4_shape must have said yes).
torch::Tensor read_mxfp4(const HfWeights& w, const std::string& name, torch::ScalarType dtype);

// The stored codes as they are: blocks U8 [E, rows, G, 16], scales U8 [E, rows, G].
std::pair<torch::Tensor, torch::Tensor> read_mxfp4_codes(const HfWeights& w,
                                                         const std::string& name);

// Whether `name` is the _blocks or _scales half of an MXFP4 tensor in `w`.
bool is_mxfp4_part(const HfWeights& w, const std::string& name);

}  // namespace moe::hf
