// The rotary family's CUDA kernel (src/kernels/rotary.cu, rotary_ops.cpp): rotary position
// embedding applied to q or k in one pass, forward and backward, an autograd-aware op and its
// raw launches (detail::). The ATen reference of the same contract is moe::model::rotate
// (moe/model/attention.h): x * cos + rotate_half(x) * sin, five elementwise kernels forward and
// as many backward. The fused op reproduces the reference's rounding points, so the two are
// bitwise equal (moe/kernels/rotary_pack.h); the GPU tests compare them.
#pragma once

#include <ATen/core/Tensor.h>

#include "moe/kernels/rotary_pack.h"

namespace moe::kernels {

// x [B, N, S, hd] in fp32, fp16 or bf16, any strides with the last dimension contiguous (q, k
// as views of the fused qkv projection); cos, sin in x's dtype, contiguous, [S, hd] or
// [B, 1, S, hd] (per-document positions). Returns a tensor of x's shape laid out as
// [B, S, N, hd] (what the reference's elementwise ops give a q/k view); the gradient flows to x.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// forward: the rotated x; backward: x is the output gradient and the result x's gradient.
// poison: fill the output with NaN first, so the tests catch elements never written.
at::Tensor rotary_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        bool backward, bool poison = false);
// The launch shape of x -> out (checks shapes and dtypes; both builds, the emulation uses it).
rotary_rows::RotaryShape rotary_shape(const at::Tensor& x, const at::Tensor& cos,
                                      const at::Tensor& sin, const at::Tensor& out);
// The output rotary_apply writes: x's shape, laid out as [B, S, N, hd].
at::Tensor rotary_output(const at::Tensor& x);
}  // namespace detail

}  // namespace moe::kernels
