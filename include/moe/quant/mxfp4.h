// MXFP4 (OCP Microscaling FP4), the format gpt-oss's released experts are stored in: blocks of
// 32 e2m1 values, two per byte (the first in the low nibble), with one e8m0 scale byte per block
// (2^(scale - 127)). Dequantized as transformers' integrations/mxfp4.py does
// (convert_moe_packed_tensors): the 16-entry e2m1 table, then ldexp by the scale's exponent.
// Every e2m1 value times a power of two is exact in bf16 and fp32 (both have fp32's exponent
// range), so the result does not depend on the dtype asked for, except past fp32's range.
#pragma once

#include <torch/types.h>

namespace moe::quant {

inline constexpr int64_t kMxfp4BlockBytes = 16;  // 32 values per block

// blocks uint8 [..., G, 16], scales uint8 [..., G] -> [..., G * 32] in `dtype`.
torch::Tensor dequantize_mxfp4(const torch::Tensor& blocks, const torch::Tensor& scales,
                               torch::ScalarType dtype);

}  // namespace moe::quant
