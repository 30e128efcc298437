// The oracle and comparisons of the rotary family (src/kernels/rotary.cu), shared by
// rotary_gpu_test.cpp and rotary_emulation_test.cpp.
//
// The oracle is the ATen reference itself (moe::model::rotate and its autograd backward) on the
// same device, compared exactly: the kernel is built to reproduce the reference's rounding
// points (moe/kernels/rotary_pack.h), so any difference, one ulp included, is a defect (an fma
// contracted by the compiler, a swapped half, a wrong stride), not rounding noise.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

struct RotaryCase {
  torch::ScalarType dtype;
  int64_t B, N, S, hd;
  bool projection_view;  // x as q is in attention: a strided view of a fused [B, S, 3 N hd]
  bool per_document;     // cos/sin [B, 1, S, hd] (restarting positions) instead of [S, hd]
};
// dtype {fp32, bf16, fp16} x hd {2, 6, 16, 64, 128} (one element per thread and 16-byte packs)
// x {contiguous, projection view} x {shared, per-document tables}; B 2, N 3, S 5; plus a
// larger bf16 case at the 1 B config's head shape.
std::vector<RotaryCase> rotary_cases();
std::string case_name(const RotaryCase& c);

struct RotaryInputs {
  torch::Tensor x;    // [B, N, S, hd]
  torch::Tensor cos;  // random values (not rotary angles: halves differ, so a swap shows)
  torch::Tensor sin;
  torch::Tensor grad;  // upstream gradient of the output, [B, N, S, hd]
};
RotaryInputs make_rotary_inputs(const RotaryCase& c, const torch::Device& device);

struct RotaryOutputs {
  torch::Tensor out;     // forward
  torch::Tensor grad_x;  // backward of `grad`
};
// Verdicts "out" and "grad_x": equal to the reference bit for bit.
std::vector<Verdict> check_rotary(const RotaryInputs& in, const RotaryOutputs& got);

}  // namespace moe::kernel_checks
