// The SwiGLU family's CUDA kernel (src/kernels/swiglu.cu, swiglu_ops.cpp): silu(gate) * up in
// one pass forward and one backward, an autograd-aware op and its raw launches (detail::). The
// ATen reference of the same contract is torch::silu(gate) * up (two kernels forward, five
// backward, silu(gate) kept for the backward). The fused op keeps gate and up only and
// reproduces the reference's rounding (moe/kernels/swiglu_pack.h); the GPU tests compare them.
// The packed form takes one [..., 2f] tensor holding gate then up (the output of one GEMM over
// [d, 2f] weights, as the grouped experts compute it) and returns one [..., 2f] gradient, so the
// GEMM's backward needs no concatenation.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "moe/kernels/swiglu_pack.h"

namespace moe::kernels {

// gate, up: CUDA tensors of one shape and dtype (fp32, fp16 or bf16). Returns silu(gate) * up,
// contiguous; gradients flow to gate and up.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// The ATen reference (the CPU path and the tests' oracle): torch::silu(gate) * up.
at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);

// The FFNs' activation: the fused op where `fused` (moe.kernels not `reference` on a CUDA
// device, settled when the model is built) and swiglu_supported(gate, up), else the reference.
at::Tensor swiglu_activation(const at::Tensor& gate, const at::Tensor& up, bool fused);

// GeGLU (Gemma 4's experts and MLPs, moe.activation geglu): gelu_tanh(gate) * up, as
// transformers' gelu_pytorch_tanh, through the same kernels with the gelu gate; the operands are
// swiglu's (swiglu_supported, swiglu_packed_supported).
at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up);
// The ATen reference: torch::gelu(gate, "tanh") * up.
at::Tensor geglu_reference(const at::Tensor& gate, const at::Tensor& up);
at::Tensor geglu_activation(const at::Tensor& gate, const at::Tensor& up, bool fused);
// The packed form: gelu_tanh(gate) * up from one [..., 2f] gate_up.
at::Tensor geglu_packed(const at::Tensor& gate_up);
at::Tensor geglu_packed_reference(const at::Tensor& gate_up);
at::Tensor geglu_packed_activation(const at::Tensor& gate_up, bool fused);

// Whether swiglu() takes these operands (else the caller uses the ATen reference): CUDA, one
// dtype and shape, fp32/fp16/bf16.
bool swiglu_supported(const at::Tensor& gate, const at::Tensor& up);

// gate_up: a CUDA tensor [..., 2f] (fp32, fp16 or bf16) whose last dimension holds gate then up.
// Returns silu(gate) * up [..., f], contiguous; the gradient flows to gate_up as one tensor.
at::Tensor swiglu_packed(const at::Tensor& gate_up);
// The ATen reference: gate_up.chunk(2, -1), then torch::silu(gate) * up.
at::Tensor swiglu_packed_reference(const at::Tensor& gate_up);
// The fused op where `fused` and swiglu_packed_supported(gate_up), else the reference.
at::Tensor swiglu_packed_activation(const at::Tensor& gate_up, bool fused);
// CUDA, fp32/fp16/bf16, at least one dimension, the last one even.
bool swiglu_packed_supported(const at::Tensor& gate_up);

namespace detail {  // raw launches (no autograd), exposed for tests and benchmarks
// poison: fill the outputs with NaN first, so the tests catch elements never written. gate_fn:
// silu (SwiGLU) or gelu_tanh (GeGLU).
using swiglu_rows::Gate;
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up, bool poison = false,
                          Gate gate_fn = Gate::kSilu);
// -> {d_gate, d_up}
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dh, const at::Tensor& gate,
                                                  const at::Tensor& up, bool poison = false,
                                                  Gate gate_fn = Gate::kSilu);
// The launch shape over contiguous tensors (checks shapes and dtypes; both builds, the emulation
// uses it): 16-byte packs when every buffer is 16-byte aligned and n a multiple of the pack.
swiglu_rows::SwigluShape swiglu_shape(const at::Tensor& gate, const at::Tensor& up,
                                      std::initializer_list<const at::Tensor*> others = {});

// The packed form's raw launches: h [..., f] from gate_up [..., 2f]; d_gate_up from dh.
at::Tensor swiglu_packed_forward(const at::Tensor& gate_up, bool poison = false,
                                 Gate gate_fn = Gate::kSilu);
at::Tensor swiglu_packed_backward(const at::Tensor& dh, const at::Tensor& gate_up,
                                  bool poison = false, Gate gate_fn = Gate::kSilu);
// Its launch shape over a contiguous gate_up, `halves` shaped like h (h, dh) and `packed` shaped
// like gate_up (d_gate_up): 16-byte packs when every buffer is aligned and f a multiple of the
// pack (so up, f elements after gate, is aligned too and no pack straddles a row).
swiglu_rows::SwigluShape swiglu_packed_shape(const at::Tensor& gate_up,
                                             std::initializer_list<const at::Tensor*> halves = {},
                                             std::initializer_list<const at::Tensor*> packed = {});
}  // namespace detail

}  // namespace moe::kernels
