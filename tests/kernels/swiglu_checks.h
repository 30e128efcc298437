// The oracle and comparisons of the SwiGLU family (src/kernels/swiglu.cu: silu * up and, with
// the gelu gate, GeGLU's gelu_tanh * up), shared by swiglu_gpu_test.cpp and
// swiglu_emulation_test.cpp.
//
// Two oracles. check_swiglu: silu(gate) * up and its gradients in double precision from the
// inputs the kernel saw, each element within a tolerance derived from the kernel's arithmetic
// (swiglu_checks.cpp): holds on any device, so the CPU emulation runs it in CI.
// swiglu_aten: the ATen reference itself (torch::silu(gate) * up and its autograd backward). The
// kernel keeps ATen's CUDA rounding points, but whether `1.f + expf(-x)` comes out as the same
// instructions (nvcc inlines expf and may contract its last step with the add) depends on how
// nvcc built each, this kernel and PyTorch's own: bit equality with ATen is reported
// (swiglu_aten_mismatches: how many elements differ, by how many ulps), not asserted; both the
// kernel's outputs and ATen's must pass check_swiglu, whose tolerance admits either rounding.
// (On the CPU ATen's exp is SLEEF's, not the C library's the emulation calls.)
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "check_util.h"
#include "moe/kernels/swiglu_pack.h"

namespace moe::kernel_checks {

struct SwigluCase {
  torch::ScalarType dtype;
  int64_t rows, cols;
  bool misaligned;      // operands starting one element past a 16-byte boundary: one element/thread
  bool packed = false;  // gate and up the halves of one [rows, 2 cols] tensor (swiglu_packed)
  kernels::swiglu_rows::Gate gate = kernels::swiglu_rows::Gate::kSilu;  // kGeluTanh: GeGLU
};
// Per gate (silu, gelu_tanh): dtype {fp32, bf16, fp16} x shapes {1x1, 3x5, 7x64, 33x1024,
// 2x4104} x {aligned, misaligned (the larger two)}, each also packed; plus bf16 4096x1024 (an
// expert FFN's rows at the 1 B config), packed, and for silu separate too.
std::vector<SwigluCase> swiglu_cases();
std::string case_name(const SwigluCase& c);

struct SwigluInputs {
  kernels::swiglu_rows::Gate gate_fn = kernels::swiglu_rows::Gate::kSilu;
  torch::Tensor gate;  // [rows, cols]; the first elements are the edge values (0, +-100,
                       // exp's overflow near -88.7, silu's minimum at -1.278, gelu's at -0.752,
                       // where 1 + tanh cancels, ...)
  torch::Tensor up;
  torch::Tensor grad;     // upstream gradient of h
  torch::Tensor gate_up;  // packed cases: [rows, 2 cols], gate and up its halves (views)
};
SwigluInputs make_swiglu_inputs(const SwigluCase& c, const torch::Device& device);

struct SwigluOutputs {
  torch::Tensor h;                   // forward
  torch::Tensor grad_gate, grad_up;  // backward of `grad` (packed: the halves of one gradient)
};
// Verdicts "h", "grad_gate", "grad_up" against the double-precision oracle.
std::vector<Verdict> check_swiglu(const SwigluInputs& in, const SwigluOutputs& got);
// ATen's forward and backward (silu(gate) * up or gelu(gate, "tanh") * up) of the same inputs, on
// their device (separate gate and up: views of the packed tensor in the packed cases; the gradients
// of the two halves).
SwigluOutputs swiglu_aten(const SwigluInputs& in);
// got against ATen's outputs bit for bit, as reports: "h_aten", "grad_gate_aten", "grad_up_aten".
std::vector<Mismatch> swiglu_aten_mismatches(const SwigluOutputs& aten, const SwigluOutputs& got);

}  // namespace moe::kernel_checks
