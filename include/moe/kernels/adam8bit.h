// The optimizer's CUDA kernel: one AdamW step on 8-bit blockwise moments (src/kernels/adam8bit.cu),
// fused: dequantise both moments, step them and the weight, requantise each 256-value block
// against its new absolute maximum. The ATen reference of the same arithmetic is
// FusedAdamW::update_reference with quant/blockwise_quant.h (the CPU path and the test oracle);
// FusedAdamW calls this kernel for CUDA parameters whose two moments are 8-bit, unless
// moe.kernels = reference.
#pragma once

#include <ATen/core/Tensor.h>

namespace moe::kernels {

// The step's scalars, computed on the host as the reference computes them (fp32 of the doubles).
struct Adam8bitScalars {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;
  float correction2 = 1.0f;  // sqrt(1 - beta2^t)
  float step_size = -1e-3f;  // -lr / (1 - beta1^t)
  float decay = 1.0f;        // 1 - lr * weight_decay (applied when weight_decay > 0)
  bool weight_decay = false;
  float grad_scale = 1.0f;  // the gradient is divided by it when != 1
};

namespace detail {
// param, grad: fp32 [n] (any shape, contiguous, same CUDA device); m_codes, v_codes: uint8 of
// param's shape; m_absmax, v_absmax: fp32 [ceil(n / 256)]; signed_map, unsigned_map: fp32 [256]
// sorted (quant/blockwise_quant.h's dynamic maps). Updates param and the four state tensors in
// place, one thread block per 256-value block.
void adam8bit_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& m_codes,
                   at::Tensor& m_absmax, at::Tensor& v_codes, at::Tensor& v_absmax,
                   const at::Tensor& signed_map, const at::Tensor& unsigned_map,
                   const Adam8bitScalars& s);
}  // namespace detail

}  // namespace moe::kernels
