// The oracles and comparisons of the experts family (the bf16 grouped GEMM, at::_grouped_mm, and
// the experts module), shared by tests/moe/experts_gpu_test.cpp and experts_emulation_test.cpp.
#pragma once

#include <torch/types.h>

#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

// One grouped GEMM and its two gradients, every operand bf16: C = A B_e per expert segment.
struct GroupedGemmInputs {
  torch::Tensor a;       // [N, K] bf16, expert-contiguous rows
  torch::Tensor b;       // [E, K, M] bf16
  torch::Tensor counts;  // [E] int64 rows per expert
  torch::Tensor grad_c;  // [N, M] bf16
};
struct GroupedGemmOutputs {
  torch::Tensor c, grad_a, grad_b;  // [N, M], [N, K], [E, K, M] bf16
};
// min_count: rows per expert are drawn from [min_count, 64].
GroupedGemmInputs make_grouped_gemm_inputs(int64_t experts, int64_t min_count,
                                           const torch::Device& device);
// Verdicts: "c", "grad_a", "grad_b" (1 bf16 ulp + the fp32 accumulation bound), and
// "grad_b_empty" (an expert without rows gets an exactly zero gradient).
std::vector<Verdict> check_grouped_gemm(const GroupedGemmInputs& in, const GroupedGemmOutputs& out);

// The experts module (SwiGLU, bf16 activations) against the double-precision graph with bf16
// rounding where the bf16 path rounds; tolerances relative to each output's scale.
struct ExpertsInputs {
  torch::Tensor x;                     // [N, d] fp32
  torch::Tensor counts;                // [E] int64, every expert >= 1 row
  torch::Tensor w_gate, w_up, w_down;  // fp32 [E, d, f], [E, d, f], [E, f, d]
  torch::Tensor grad_y;                // [N, d] fp32
  bool fused_gate_up = false;          // the path under test: gate and up as one GEMM
};
ExpertsInputs make_experts_inputs(int64_t experts, const torch::Device& device);
struct ExpertsOutputs {
  torch::Tensor y, grad_x, grad_w_gate, grad_w_up, grad_w_down;
};
// Verdicts: "y", "grad_x", "grad_w_gate", "grad_w_up", "grad_w_down".
std::vector<Verdict> check_experts(const ExpertsInputs& in, const ExpertsOutputs& out);

}  // namespace moe::kernel_checks
