// 8-bit blockwise dynamic quantisation of optimizer moments, as bitsandbytes' 8-bit blockwise
// Adam (Dettmers et al., "8-bit Optimizers via Block-wise Quantization") defines it: blocks of
// 256 values, each scaled by its absolute maximum into [-1, 1] and stored as the index of the
// nearest entry of a 256-entry dynamic map (signed for the first moment, unsigned for the second).
// ATen only: the same code runs on the CPU (the reference) and on a GPU.
#pragma once

#include <ATen/core/Tensor.h>

namespace moe::quant {

inline constexpr int64_t kQuantBlock = 256;

// bitsandbytes' create_dynamic_map(signed): 256 sorted fp32 values in [-1, 1] (signed) or
// [0, 1], dense near zero. Built once per device and cached.
at::Tensor dynamic_map(bool is_signed, const at::Device& device);

// Blocks of a tensor of n values: ceil(n / kQuantBlock).
int64_t quant_blocks(int64_t numel);

// x (fp32, any shape) -> codes (uint8, x's shape) and absmax (fp32 [blocks]), written in place.
void quantize_blockwise(const at::Tensor& x, const at::Tensor& map, at::Tensor& codes,
                        at::Tensor& absmax);
// codes + absmax -> fp32 values of the codes' shape.
at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax,
                                const at::Tensor& map);

}  // namespace moe::quant
