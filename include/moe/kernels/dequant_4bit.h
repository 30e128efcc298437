// Dequantization of a bitsandbytes 4-bit matrix (quant/bnb_4bit.h) straight into a caller's
// buffer, the step before each GEMM over a 4-bit frozen base: our CUDA kernel
// (src/kernels/dequant_4bit.cu) on CUDA tensors, else the ATen reference
// quant::dequantize_4bit. The kernel reproduces the reference bit for bit (fp32 products and
// the double-quant absmax without fused multiply-adds); the emulation and GPU tests compare them.
#pragma once

#include <ATen/core/Tensor.h>

#include "moe/kernels/dequant_4bit_pack.h"
#include "moe/quant/bnb_4bit.h"

namespace moe::kernels {

// out: contiguous, q.numel() elements, fp32 / bf16 / fp16, on the state's device. Writes
// quant::dequantize_4bit(q, out.dtype()) into it: the CUDA kernel where `fused` and
// dequantize_4bit_supported(q, out), else the reference (then copied in).
void dequantize_4bit_into(const quant::Quantized4bit& q, const at::Tensor& out, bool fused);

// CUDA state and output, contiguous output of q.numel() elements, fp32 / bf16 / fp16.
bool dequantize_4bit_supported(const quant::Quantized4bit& q, const at::Tensor& out);

namespace detail {  // the raw launch, exposed for tests and benchmarks
// poison: fill `out` with NaN first, so the tests catch elements never written.
void dequantize_4bit_cuda(const quant::Quantized4bit& q, const at::Tensor& out,
                          bool poison = false);
// The launch shape (both builds; the emulation uses it): checks q and out (dtypes, sizes,
// contiguity, one device) and picks the values per thread.
dequant_4bit_rows::Dequant4bitShape dequantize_4bit_shape(const quant::Quantized4bit& q,
                                                          const at::Tensor& out);
// Pointers into q's buffers, on their device.
dequant_4bit_rows::Dequant4bitArgs dequantize_4bit_args(const quant::Quantized4bit& q);
// q.type's code book and bitsandbytes' dynamic map, the values the reference reads.
dequant_4bit_rows::Dequant4bitTables dequantize_4bit_tables(quant::Quant4bitType type);
}  // namespace detail

}  // namespace moe::kernels
