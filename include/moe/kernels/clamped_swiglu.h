// gpt-oss's clamped SwiGLU (transformers' GptOssExperts._apply_gate), the experts' activation
// when moe.activation = clamped_swiglu:
//   g = min(gate, limit), u = clamp(up, -limit, limit), h = (u + 1) * (g * sigmoid(alpha * g))
// The ATen reference below is the CPU path and the oracle; clamped_swiglu() is the fused CUDA op
// of the same contract (src/kernels/clamped_swiglu.cu, clamped_swiglu_ops.cpp), selected by
// clamped_swiglu_activation. Gradients follow torch's clamp: they pass where the input lies
// inside [min, max], bounds included, and are zero outside.
//
// The reference is seven ATen kernels forward and ten backward, and autograd keeps the clamped
// operands, sigmoid's output, the product and u + 1 from the forward to the backward; the fused
// op is one kernel each way, keeps gate and up only, and reproduces the reference's rounding step
// for step (moe/kernels/clamped_swiglu_pack.h: what rounds where, and the one caveat, how nvcc
// built exp in each); the GPU tests compare them.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <utility>

#include "moe/kernels/clamped_swiglu_pack.h"

namespace moe::kernels {

// The ATen reference, in transformers' order of operations (the CPU path, the tests' oracle).
at::Tensor clamped_swiglu_reference(const at::Tensor& gate, const at::Tensor& up, double limit,
                                    double alpha);

// gate, up: CUDA tensors of one shape and dtype (fp32, fp16 or bf16). Returns h, contiguous;
// gradients flow to gate and up. Throws where the kernels were not compiled.
at::Tensor clamped_swiglu(const at::Tensor& gate, const at::Tensor& up, double limit, double alpha);

// Whether clamped_swiglu() takes these operands: CUDA kernels compiled, CUDA tensors of one
// shape and dtype, fp32/fp16/bf16.
bool clamped_swiglu_supported(const at::Tensor& gate, const at::Tensor& up);

// The experts' activation: the fused op where `fused` and clamped_swiglu_supported, else the
// reference.
at::Tensor clamped_swiglu_activation(const at::Tensor& gate, const at::Tensor& up, double limit,
                                     double alpha, bool fused);

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// poison: fill the outputs with NaN first, so the tests catch elements never written.
at::Tensor clamped_swiglu_forward(const at::Tensor& gate, const at::Tensor& up, double limit,
                                  double alpha, bool poison = false);
// -> {d_gate, d_up}
std::pair<at::Tensor, at::Tensor> clamped_swiglu_backward(const at::Tensor& dh,
                                                          const at::Tensor& gate,
                                                          const at::Tensor& up, double limit,
                                                          double alpha, bool poison = false);
// The launch shape over contiguous tensors (checks shapes and dtypes; both builds, the emulation
// uses it): 16-byte packs when every buffer is 16-byte aligned and n a multiple of the pack.
clamped_swiglu_rows::ClampedSwigluShape clamped_swiglu_shape(
    const at::Tensor& gate, const at::Tensor& up,
    std::initializer_list<const at::Tensor*> others = {});
}  // namespace detail

}  // namespace moe::kernels
