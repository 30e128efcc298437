// FP8 blockwise weights, the format of DeepSeek-V3 / Kimi-K2 / Moonlight's released checkpoints
// and of the -FP8 releases of Qwen3-MoE and GLM-4.5: an e4m3 matrix and, per block of
// block_rows x block_cols values, one `weight_scale_inv` (the factor back to the real values;
// fp32 or bf16) on the ceil grid, so edge blocks may be partial (DeepSeek-V3's 576-row
// kv_a_proj_with_mqa under 128 x 128 blocks: 5 block rows, the last of 64). Dequantized as
// transformers' integrations/finegrained_fp8.py `_dequantize_fp8_weight` does: the weight and the
// scales cast to the output dtype, then one multiply per value in that dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace moe::quant {

// {block_rows, block_cols}; nullopt: one scale for the whole tensor.
using Fp8Block = std::optional<std::pair<int64_t, int64_t>>;

// The scale grid of a [..., rows, cols] weight: [..., ceil(rows / br), ceil(cols / bc)], or
// {} (one value) without blocks.
std::vector<int64_t> fp8_scale_shape(at::IntArrayRef weight_shape, const Fp8Block& block);

// Without blocks (weight_block_size null), a stacked weight may carry one scale per slice:
// transformers' FP8 experts hold [E, 2f, d] gate_up weights with [E, 2, 1] scales (the gate's and
// the up half's per expert) and [E, d, f] down weights with [E, 1, 1]. Whether `scale_shape` is
// such a grid for `weight_shape`: the same leading dimensions, then [sr, sc] dividing [rows, cols]
// (transformers' Fp8Dequantize derives its blocks from the scales' shape likewise).
bool fp8_per_slice_scales(at::IntArrayRef weight_shape, at::IntArrayRef scale_shape);

// weight float8_e4m3fn / float8_e5m2 [..., rows, cols], scale_inv fp32 / bf16 in the shape
// fp8_scale_shape gives (without blocks: one value, or per slice as above) -> [..., rows, cols]
// in `dtype`.
at::Tensor dequantize_fp8_blockwise(const at::Tensor& weight, const at::Tensor& scale_inv,
                                    const Fp8Block& block, at::ScalarType dtype);

}  // namespace moe::quant
