// bitsandbytes' 4-bit blockwise quantization (quantize_4bit / dequantize_4bit of bitsandbytes
// 0.50, CPU), reproduced bit for bit: the frozen base of a QLoRA run (docs/finetune.md).
//   - A matrix is flattened row-major ([out, in], nn.Linear's layout) and cut into blocks of 64.
//   - absmax = max |w| per block (fp32); w * (1 / absmax) is clamped to [-1, 1] and mapped to the
//     nearest of 16 codes (NF4 or FP4; ties to the lower code), two codes per byte, the first in
//     the high nibble.
//   - Double quant: absmax - mean(absmax) quantized again to 8 bits in blocks of 256 with
//     bitsandbytes' signed dynamic map; the mean is kept as the offset.
// Dequantization: code * absmax in fp32 (absmax = dyn[q] * nested_absmax + offset first), then
// the target dtype (round to nearest even).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "moe/config/choices.h"

namespace moe::quant {

using config::Quant4bitType;

inline constexpr int64_t kBlocksize = 64;         // bitsandbytes' default for 4-bit
inline constexpr int64_t kNestedBlocksize = 256;  // quantize_blockwise of the absmax

// One quantized matrix: what bitsandbytes' Params4bit holds (its QuantState).
struct Quantized4bit {
  torch::Tensor codes;   // uint8 [ceil(n / 2)]
  torch::Tensor absmax;  // fp32 [blocks], or uint8 [blocks] under double quant
  // Double quant only (undefined otherwise).
  torch::Tensor nested_absmax;  // fp32 [ceil(blocks / 256)]
  torch::Tensor offset;         // fp32 [] the mean of the fp32 absmax
  std::vector<int64_t> shape;   // the matrix's shape ([out, in])
  Quant4bitType type = Quant4bitType::kNf4;
  int64_t blocksize = kBlocksize;

  bool double_quant() const { return nested_absmax.defined(); }
  int64_t numel() const;
  int64_t blocks() const { return (numel() + blocksize - 1) / blocksize; }
  // Bytes held: codes, absmax and (double quant) the nested statistics.
  int64_t bytes() const;
  // The same state on `device` (codes and statistics moved, nothing recomputed).
  Quantized4bit to(const torch::Device& device) const;
};

// The 16 fp32 values of the code book in bitsandbytes' code order (get_4bit_type): NF4 sorted;
// FP4 sign-magnitude, normalised by 12.
torch::Tensor code_4bit(Quant4bitType type);
// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True), sorted): the code of
// the double-quantized absmax. 256 fp32 values.
torch::Tensor dynamic_map();

// Quantizes `w` (fp32, bf16 or fp16, any shape; its values read row-major) as
// bitsandbytes.functional.quantize_4bit(w, blocksize, compress_statistics = double_quant,
// quant_type) does on the CPU.
Quantized4bit quantize_4bit(const torch::Tensor& w, Quant4bitType type, bool double_quant,
                            int64_t blocksize = kBlocksize);

// The per-block absmax in fp32 (dequantized under double quant), on the state's device.
torch::Tensor dequantize_absmax(const Quantized4bit& q);

// The ATen reference of dequantize_4bit: q.shape, `dtype`, on the state's device. The CPU path
// and the test oracle of the CUDA kernel (kernels/dequant_4bit.h).
torch::Tensor dequantize_4bit(const Quantized4bit& q, torch::ScalarType dtype = torch::kFloat);

}  // namespace moe::quant
