// compressed-tensors "pack-quantized" INT4 checkpoints (Kimi-K2-Thinking, Kimi-K2.5 and later:
// their routed experts): in place of NAME (".../gate_proj.weight") the tensors NAME_packed (I32
// [out, in / 8]: eight 4-bit codes per word, element i at bits 4i.., each stored as code + 8),
// NAME_scale (BF16 / F16 / F32 [out, in / group_size]) and NAME_shape ([out, in]), with
// config.json's quantization_config {"quant_method": "compressed-tensors", "format":
// "pack-quantized", "config_groups": {...: {"weights": {"num_bits": 4, "type": "int",
// "symmetric": true, "strategy": "group", "group_size": 32}}}}. Import dequantizes as
// compressed-tensors does (code x scale, in the scale's dtype).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "moe/hf/hf_files.h"

namespace moe::hf {

struct PackQuantized {
  int64_t group_size = 32;  // input columns per scale
};

// What config.json says of pack-quantized weights: nullopt without a compressed-tensors
// quantization_config; a format or scheme other than symmetric 4-bit integer groups (another
// bit width, zero points, activation quantization, act-order) is a UserError naming the key.
std::optional<PackQuantized> pack_quantized_format(const nlohmann::json& hf_config,
                                                   const std::string& file);

// The weight's [out, in] when `name` is stored pack-quantized in `w` (NAME_packed present);
// nullopt otherwise. A missing scale or shape, wrong dtypes, or shapes that do not agree with
// NAME_shape and the group size are a UserError naming the file and tensor; so is
// NAME_packed without a pack-quantized quantization_config.
std::optional<std::vector<int64_t>> pack_quantized_shape(
    const HfWeights& w, const std::string& name, const std::optional<PackQuantized>& format);

// The dequantized weight in the scale's dtype (pack_quantized_shape must have said yes).
torch::Tensor read_pack_quantized(const HfWeights& w, const std::string& name);

// Whether `name` is the _packed, _scale or _shape part of a pack-quantized weight in `w`.
bool is_pack_quantized_part(const HfWeights& w, const std::string& name);

}  // namespace moe::hf
