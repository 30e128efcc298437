// The oracle and comparisons of gpt-oss's clamped SwiGLU kernel (src/kernels/clamped_swiglu.cu),
// shared by clamped_swiglu_gpu_test.cpp and clamped_swiglu_emulation_test.cpp.
//
// Two oracles. check_clamped_swiglu: the reference's math in double precision from the inputs the
// kernel saw (clamped_swiglu_oracle), each element within a tolerance derived from the kernel's
// arithmetic (clamped_swiglu_checks.cpp): holds on any device, so the CPU emulation runs it in
// CI. The clamps are compared exactly: where torch's clamp backward stops a gradient (outside the
// bounds) the gradient must be 0, and inside (bounds included) it is compared with the oracle.
// clamped_swiglu_aten: the ATen reference itself and its autograd backward. The kernel keeps
// ATen's CUDA rounding points; bit equality with ATen depends on how nvcc built `1.f + expf(-a)`
// in each, so it is reported (clamped_swiglu_aten_mismatches), not asserted; ATen's outputs must
// pass check_clamped_swiglu too (on the CPU, with SLEEF's exp and ATen's CPU rounding, as well).
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

struct ClampedSwigluCase {
  torch::ScalarType dtype;
  int64_t rows, cols;
  bool misaligned;  // operands starting one element past a 16-byte boundary: one element/thread
  double limit = 7.0, alpha = 1.702;  // gpt-oss's swiglu_limit and alpha
};
// dtype {fp32, bf16, fp16} x shapes {1x1, 3x5, 7x64, 33x1024, 2x4104} x {aligned, misaligned
// (the larger two)}; per dtype a 33x1024 case with limit 3.3 (not a bf16/fp16 value: the bound
// rounds to T) and alpha 0.9; plus bf16 1024x2880 (gpt-oss's expert width).
std::vector<ClampedSwigluCase> clamped_swiglu_cases();
std::string case_name(const ClampedSwigluCase& c);

struct ClampedSwigluInputs {
  torch::Tensor gate;  // [rows, cols]; the first elements are the edge values (exactly +-limit,
                       // one ulp inside and outside, far beyond, exp's overflow, the product's
                       // stationary point, ...)
  torch::Tensor up;    // likewise: +-limit, one ulp inside and outside, -1 (u + 1 = 0), ...
  torch::Tensor grad;  // upstream gradient of h
  double limit = 7.0, alpha = 1.702;
};
ClampedSwigluInputs make_clamped_swiglu_inputs(const ClampedSwigluCase& c,
                                               const torch::Device& device);

// The bound and slope as the kernel and ATen's CUDA kernels take them: T(limit) (exactly
// representable in the dtype) and alpha rounded to fp32.
double clamped_swiglu_bound(const ClampedSwigluInputs& in);
double clamped_swiglu_alpha(const ClampedSwigluInputs& in);
// Where torch's clamp backward passes each gradient: gate <= bound, -bound <= up <= bound.
std::pair<torch::Tensor, torch::Tensor> clamped_swiglu_inside(const ClampedSwigluInputs& in);

struct ClampedSwigluOutputs {
  torch::Tensor h;                   // forward
  torch::Tensor grad_gate, grad_up;  // backward of `grad`
};
// The reference's math in double precision (clamped_swiglu_bound, clamped_swiglu_alpha).
ClampedSwigluOutputs clamped_swiglu_oracle(const ClampedSwigluInputs& in);
// Verdicts against the double-precision oracle: "h"; "grad_gate" and "grad_up" where the clamp
// passes the gradient (within tolerances), "grad_gate_outside" and "grad_up_outside" where it
// stops it (exactly 0).
std::vector<Verdict> check_clamped_swiglu(const ClampedSwigluInputs& in,
                                          const ClampedSwigluOutputs& got);
// ATen's forward and backward of the same inputs on their device (clamped_swiglu_reference with
// in.limit and in.alpha, autograd).
ClampedSwigluOutputs clamped_swiglu_aten(const ClampedSwigluInputs& in);
// got against ATen's outputs bit for bit, as reports: "h_aten", "grad_gate_aten", "grad_up_aten".
std::vector<Mismatch> clamped_swiglu_aten_mismatches(const ClampedSwigluOutputs& aten,
                                                     const ClampedSwigluOutputs& got);

}  // namespace moe::kernel_checks
