// The oracle and comparisons of the optimizer's kernel (src/kernels/adam8bit.cu: one AdamW step
// on 8-bit blockwise moments), shared by its GPU test (train/gpu_tiers_test.cpp) and its CPU
// emulation test (optimizer_emulation_test.cpp). The oracle is FusedAdamW's ATen reference
// update on the CPU.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "check_util.h"
#include "moe/kernels/adam8bit.h"

namespace moe::kernel_checks {

struct Adam8bitCase {
  int64_t numel = 4096;  // >= 4096 (below, FusedAdamW keeps fp32 moments)
  double grad_scale = 1.0, weight_decay = 0.01;
  int64_t step = 3;  // the step this update takes (1-based: the bias corrections)
};
std::vector<Adam8bitCase> adam8bit_cases();
std::string case_name(const Adam8bitCase& c);

struct Adam8bitInputs {
  Adam8bitCase c;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  torch::Tensor param, grad;                           // fp32 [numel]
  torch::Tensor m_codes, m_absmax, v_codes, v_absmax;  // a state quantised from random moments
};
// Random weights, gradients and moments (quantised with the dynamic maps), on `device`.
Adam8bitInputs make_adam8bit_inputs(const Adam8bitCase& c, const torch::Device& device);
// The step's scalars as FusedAdamW computes them on the host.
kernels::Adam8bitScalars adam8bit_scalars(const Adam8bitInputs& in);

struct Adam8bitOutputs {
  torch::Tensor param, m_codes, m_absmax, v_codes, v_absmax;
};
// Verdicts: "param", "m_absmax", "v_absmax", "m_codes", "v_codes". Weights within 1e-6 x
// (1 + |p|) of the reference (a thousandth of a 1e-3 step), absmax within 1e-6 relative, codes
// equal but for at most 0.1% that differ by one code (a moment within rounding of a midpoint).
std::vector<Verdict> check_adam8bit(const Adam8bitInputs& in, const Adam8bitOutputs& out);

// The weights' tolerance of one step from `in` derived from the two sides' arithmetic
// (train/device_bounds.h, step_bound: the 8-bit reference and kernel share their fp32 scalars):
// a double tensor of the weights' shape. check_adam8bit's 1e-6 x (1 + |p|) must not be below it
// (device_bounds_test.cpp checks that over the grid).
torch::Tensor adam8bit_weight_tolerance(const Adam8bitInputs& in);

// One step taken from the same state `in` by two implementations (the GPU test: FusedAdamW with
// the kernel against FusedAdamW on the CPU), both compared with the derived bounds, not with an
// oracle: "param" (adam8bit_weight_tolerance), "m_absmax" (eps_m times the block's largest
// absolute moment), "v_absmax" (eps_v relative), and "m_codes", "v_codes" as check_adam8bit's
// (a code differs where the two sides' moments straddle a midpoint: by one, rarely).
std::vector<Verdict> check_adam8bit_pair(const Adam8bitInputs& in, const Adam8bitOutputs& a,
                                         const Adam8bitOutputs& b);

}  // namespace moe::kernel_checks
