// The grid and comparison of the MXFP4 dequantization kernel (src/kernels/dequant_mxfp4.cu),
// shared by dequant_mxfp4_gpu_test.cpp and dequant_mxfp4_emulation_test.cpp.
//
// One oracle: the ATen reference quant::dequantize_mxfp4 (transformers' convert_moe_packed_tensors;
// tests/hf covers that). The kernel rounds where it rounds (one exact product, one cast to nearest
// even), so the comparison is bitwise, every element, signed zeros included, and a NaN (the
// poison of an element never written; the reference makes none) always fails.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

enum class Mxfp4Data {
  kAllCodes,  // block b: scale byte b % 256, its 16 bytes every code in both nibbles
  kRandom,    // uniform random bytes and scale bytes
  kWeights,   // quant::quantize_mxfp4 of normal weights with edge rows (zeros, fp16 overflow,
              // fp16 subnormals, ~1e-30)
};

struct DequantMxfp4Case {
  Mxfp4Data data;
  torch::ScalarType dtype;     // of the output
  std::vector<int64_t> shape;  // the scales' [..., G]; blocks [..., G, 16], n = 32 x numel
  bool misaligned = false;     // output one element past a 16-byte boundary: a byte a thread
};
// {fp32, bf16, fp16} x {all codes [256] (aligned, misaligned), random [1], [3, 5], [7, 33]
// (aligned, misaligned), [2, 3, 90], weights [4, 64, 90] (an expert stack at gpt-oss's hidden
// size 2880), [45, 90]}.
std::vector<DequantMxfp4Case> dequant_mxfp4_cases();
std::string case_name(const DequantMxfp4Case& c);

struct Mxfp4Tensors {
  torch::Tensor blocks;  // uint8 [..., G, 16]
  torch::Tensor scales;  // uint8 [..., G]
  int64_t numel() const { return blocks.numel() * 2; }
  Mxfp4Tensors to(const torch::Device& device) const {
    return {blocks.to(device), scales.to(device)};
  }
};
// The case's blocks and scales (CPU; made once per data and shape, shared: not to be written).
Mxfp4Tensors make_mxfp4(const DequantMxfp4Case& c);
// The output the launcher fills: n values of c.dtype on `device`, NaN (an element never written
// fails), starting one element past an allocation when c.misaligned.
torch::Tensor make_mxfp4_output(const DequantMxfp4Case& c, int64_t n, const torch::Device& device);

// Verdict "out": got (n values) bit for bit against quant::dequantize_mxfp4(blocks, scales, got's
// dtype) flattened, computed on the blocks' device.
Verdict check_dequant_mxfp4(const Mxfp4Tensors& m, const torch::Tensor& got);

}  // namespace moe::kernel_checks
