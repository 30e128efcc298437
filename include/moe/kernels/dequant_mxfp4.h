// Dequantization of an MXFP4 stack (quant/mxfp4.h: gpt-oss's experts) straight into a caller's
// buffer, the step before each GEMM over an MXFP4 frozen base: our CUDA kernel
// (src/kernels/dequant_mxfp4.cu) on CUDA tensors, else the ATen reference quant::dequantize_mxfp4.
// The kernel reproduces the reference bit for bit (every code, every scale byte, every output
// dtype); the emulation and GPU tests compare them.
#pragma once

#include <ATen/core/Tensor.h>

#include "moe/kernels/dequant_mxfp4_pack.h"

namespace moe::kernels {

// blocks uint8 [..., G, 16], scales uint8 [..., G]; out: contiguous, blocks.numel() * 2 elements
// (any shape), fp32 / bf16 / fp16, on the blocks' device. Writes
// quant::dequantize_mxfp4(blocks, scales, out.dtype()) into it: the CUDA kernel where `fused` and
// dequantize_mxfp4_supported(blocks, scales, out), else the reference (then copied in).
void dequantize_mxfp4_into(const at::Tensor& blocks, const at::Tensor& scales,
                           const at::Tensor& out, bool fused);

// CUDA output, contiguous uint8 blocks and scales on its device, a contiguous output of
// blocks.numel() * 2 elements, fp32 / bf16 / fp16.
bool dequantize_mxfp4_supported(const at::Tensor& blocks, const at::Tensor& scales,
                                const at::Tensor& out);

namespace detail {  // the raw launch, exposed for tests and benchmarks
// poison: fill `out` with NaN first, so the tests catch elements never written.
void dequantize_mxfp4_cuda(const at::Tensor& blocks, const at::Tensor& scales,
                           const at::Tensor& out, bool poison = false);
// The launch shape (both builds; the emulation uses it): checks blocks, scales and out (dtypes,
// sizes, contiguity, one device) and picks the values per thread.
dequant_mxfp4_rows::DequantMxfp4Shape dequantize_mxfp4_shape(const at::Tensor& blocks,
                                                             const at::Tensor& scales,
                                                             const at::Tensor& out);
// Pointers into the buffers, on their device.
dequant_mxfp4_rows::DequantMxfp4Args dequantize_mxfp4_args(const at::Tensor& blocks,
                                                           const at::Tensor& scales);
}  // namespace detail

}  // namespace moe::kernels
