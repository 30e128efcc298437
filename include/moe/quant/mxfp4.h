// MXFP4 (OCP Microscaling FP4), the format gpt-oss's released experts are stored in: blocks of
// 32 e2m1 values, two per byte (the first in the low nibble), with one e8m0 scale byte per block
// (2^(scale - 127)). Dequantized as transformers' integrations/mxfp4.py does
// (convert_moe_packed_tensors): the 16-entry e2m1 table, then ldexp by the scale's exponent.
// Every e2m1 value times a power of two is exact in bf16 and fp32 (both have fp32's exponent
// range), so the result does not depend on the dtype asked for, except past fp32's range.
#pragma once

#include <utility>

#include <torch/types.h>

namespace moe::quant {

inline constexpr int64_t kMxfp4BlockBytes = 16;  // 32 values per block

// blocks uint8 [..., G, 16], scales uint8 [..., G] -> [..., G * 32] in `dtype`.
torch::Tensor dequantize_mxfp4(const torch::Tensor& blocks, const torch::Tensor& scales,
                               torch::ScalarType dtype);

// MXFP4 quantization (OCP Microscaling v1.0) of m [..., n], n a multiple of 32: per block of 32
// the shared exponent floor(log2(max |x|)) - 2 (e2m1's largest exponent; 0 -> the smallest scale,
// clamped to e8m0's range), each x / 2^exponent rounded to the nearest e2m1 value, ties to the
// even code, saturating at +-6. -> {blocks uint8 [..., n / 32, 16], scales uint8 [..., n / 32]}.
std::pair<torch::Tensor, torch::Tensor> quantize_mxfp4(const torch::Tensor& m);

}  // namespace moe::quant
