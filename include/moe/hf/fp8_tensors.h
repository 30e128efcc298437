// FP8 blockwise checkpoints (quant/fp8_blockwise.h): NAME is an F8_E4M3 (or F8_E5M2) tensor and
// NAME_scale_inv its F32 / BF16 scales, with config.json's quantization_config
// {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"} giving
// the block (DeepSeek-V3, Kimi-K2, Moonlight; Qwen3-MoE-FP8, GLM-4.5-FP8), or per-tensor scales
// with static input scales ("weight_block_size": null, "activation_scheme": "static": Mistral
// Small 4). Import dequantizes them as transformers does.
#pragma once

#include <optional>
#include <string>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "moe/hf/hf_files.h"
#include "moe/quant/fp8_blockwise.h"

namespace moe::hf {

// What config.json says of FP8 weights: nullopt without an "fp8" quantization_config, else its
// block (nullopt inside: per-tensor scales, or per slice of stacked experts). A weight_block_size
// that is not two positive integers, or an activation_scheme other than "dynamic" or "static"
// (input scales for FP8 compute, which the import drops), is a UserError naming the file and key.
std::optional<quant::Fp8Block> fp8_format(const nlohmann::json& hf_config, const std::string& file);

// Whether `name` is stored as FP8 in `w` (an F8 dtype). Its NAME_scale_inv must then exist in
// the grid fp8_scale_shape gives, F32 or BF16, and `format` must be known: UserError naming the
// file and tensor otherwise.
bool is_fp8_weight(const HfWeights& w, const std::string& name,
                   const std::optional<quant::Fp8Block>& format);

// Whether `name` is the NAME_scale_inv of an FP8 weight in `w`, or a static scheme's input scale
// of one (PREFIX.activation_scale, NAME_activation_scale): neither is a weight of ours.
bool is_fp8_scale(const HfWeights& w, const std::string& name);

// The dequantized tensor in `dtype` (is_fp8_weight must have said yes); its pages released.
torch::Tensor read_fp8(const HfWeights& w, const std::string& name, const quant::Fp8Block& block,
                       torch::ScalarType dtype);

}  // namespace moe::hf
