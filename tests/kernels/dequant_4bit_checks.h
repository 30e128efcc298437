// The grid and comparison of the 4-bit dequantization kernel (src/kernels/dequant_4bit.cu),
// shared by dequant_4bit_gpu_test.cpp and dequant_4bit_emulation_test.cpp.
//
// One oracle: the ATen reference quant::dequantize_4bit, itself checked bit for bit against
// bitsandbytes (tests/quant/bnb_4bit_test.py). The kernel rounds where it rounds (fp32 products,
// the double-quant absmax as a product then a sum, one cast to nearest even), so the comparison
// is bitwise, every element, signed zeros included.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "check_util.h"
#include "moe/quant/bnb_4bit.h"

namespace moe::kernel_checks {

struct Dequant4bitCase {
  quant::Quant4bitType type;
  bool double_quant;
  torch::ScalarType dtype;  // of the output
  std::vector<int64_t> shape;
  bool misaligned = false;  // output one element past a 16-byte boundary: two values a thread
};
// {nf4, fp4} x double quant {off, on} x {fp32, bf16, fp16} x shapes {1, 3, 7x9, 5x100, 33x65
// (odd n, partial last blocks), 64x64 misaligned, 768x2048 (a projection), [4 x 352, 704] (an
// expert stack: 60.5 nested blocks of absmax)}.
std::vector<Dequant4bitCase> dequant_4bit_cases();
std::string case_name(const Dequant4bitCase& c);

// The weights of a case (fp32 on the CPU): normal values with edge blocks at the front (zeros,
// fp16 overflows, fp16 subnormals, ~1e-30, a lone nonzero value) where n has room for them.
torch::Tensor make_dequant_weights(const Dequant4bitCase& c);
// The quantized state of the case's weights (CPU), as quant::quantize_4bit makes it (made once
// per type, double quant and shape; the tensors are shared: not to be written).
quant::Quantized4bit make_quantized(const Dequant4bitCase& c);
// The output the launcher fills: n values of c.dtype on `device`, NaN (an element never written
// fails), starting one element past an allocation when c.misaligned.
torch::Tensor make_dequant_output(const Dequant4bitCase& c, int64_t n, const torch::Device& device);

// Verdict "out": got (n values) bit for bit against quant::dequantize_4bit(q, got's dtype),
// computed on q's device.
Verdict check_dequant_4bit(const quant::Quantized4bit& q, const torch::Tensor& got);

}  // namespace moe::kernel_checks
