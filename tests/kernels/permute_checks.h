// The oracles and comparisons of the permute family (src/kernels/permute.cu: dispatch_plan,
// permute, combine), shared by permute_gpu_test.cpp and permute_emulation_test.cpp.
#pragma once

#include <torch/types.h>

#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

// ---- permute / combine ----------------------------------------------------------------------
struct PermuteInputs {
  int64_t tokens = 0, k = 0, d = 64;
  torch::Tensor x;                   // [T, d] dtype
  torch::Tensor source_token;        // [N] int64, the reference plan (10% of assignments dropped)
  torch::Tensor source_assignment;   // [N] int64
  torch::Tensor rows_of_assignment;  // [T*k] int64, -1 for dropped assignments
  torch::Tensor y;                   // [N, d] dtype: expert outputs to combine
  torch::Tensor weights;             // [T, k] fp32 gate weights (0 where dropped)
  torch::Tensor grad_out;            // [T, d] dtype: upstream gradient of the combine
  torch::Tensor grad_permuted;       // [N, d] dtype: upstream gradient of the permute
};
// Same values on every device (drawn on the CPU, then moved).
PermuteInputs make_permute_inputs(const PermuteCase& c, const torch::Device& device);

struct PermuteOutputs {
  torch::Tensor rows_of_assignment;  // assignment_rows
  torch::Tensor permuted;            // permute_forward [N, d]
  torch::Tensor grad_x;              // permute_backward [T, d]
  torch::Tensor combined;            // combine_forward [T, d]
  torch::Tensor grad_y;              // combine_backward [N, d]
  torch::Tensor grad_w;              // combine_backward [T, k] fp32
};
// Verdicts: "rows", "permute", "permute_bwd", "combine", "combine_bwd_y", "combine_bwd_w".
std::vector<Verdict> check_permute(const PermuteInputs& in, const PermuteOutputs& out);

// ---- dispatch plan (permute.cu plan_tiles) ------------------------------------------------
struct PlanOutputs {
  torch::Tensor source_token, source_assignment, tokens_per_expert;
};
// Skewed routing (expert 0 takes about half), every assignment kept.
torch::Tensor make_plan_topk(const PlanCase& c, const torch::Device& device);
// Verdicts: "source_token", "source_assignment", "tokens_per_expert" (exact, against the
// stable-sort reference moe::dispatch_plan).
std::vector<Verdict> check_plan(const torch::Tensor& topk_idx, int64_t num_experts,
                                const PlanOutputs& got);

}  // namespace moe::kernel_checks
