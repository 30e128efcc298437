// The comparisons the GPU kernel tests make, shared with their CPU emulation tests.
//
// Each kernel is checked against an oracle computed in double precision from the very inputs the
// kernel saw (the fp32/bf16/fp16 values, widened exactly), never against another rounded
// implementation. A tolerance is derived per element from the kernel's arithmetic (where it
// accumulates in fp32, where it rounds to the output dtype) and written next to the check in
// kernel_checks.cpp. Indices, counts and permutations compare exactly.
//
// The same functions run on CUDA tensors (tests/kernels/*_gpu_test.cpp, oracles computed on the
// device) and on CPU tensors (tests/kernels/kernel_emulation_test.cpp, where a CPU emulation of
// each kernel's order of operations stands in for the kernel): the emulation passing shows the
// tolerances admit the kernel's arithmetic; the mutation cases there show each check can fail.
#pragma once

#include <torch/types.h>

#include <ostream>
#include <string>
#include <vector>

namespace moe::kernel_checks {

constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff: |fl(x) - x| <= kU32 * |x|

// One comparison: how many elements were checked and failed, and the first failure in words.
struct Verdict {
  std::string name;
  int64_t checked = 0;
  int64_t failed = 0;
  std::string detail;  // first failing element (or the reason), empty when ok
  // within(): the element whose tolerance is the smallest in ulps of the output's dtype, and
  // that many ulps (mutation tests move it by 4 ulp and expect a failure).
  int64_t tightest = -1;
  double tightest_ulps = 0;
  bool ok() const { return failed == 0 && detail.empty(); }
};
std::ostream& operator<<(std::ostream& os, const Verdict& v);
// All ok; else a message listing every failed verdict (for EXPECT_TRUE(...) << message).
bool all_ok(const std::vector<Verdict>& vs, std::string* message);
// The verdict called `name` (a test asserts that a mutation failed exactly that check).
const Verdict& find(const std::vector<Verdict>& vs, const std::string& name);

// ulp of `dtype` at the magnitudes |m| (double tensor of m's shape; subnormals included).
torch::Tensor ulp(const torch::Tensor& m, torch::ScalarType dtype);

// got == want element for element (same shape; NaN never equals).
Verdict exact(const std::string& name, const torch::Tensor& got, const torch::Tensor& want);
// |got - ref| <= tol element for element (ref, tol double; a NaN in got fails).
Verdict within(const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
               const torch::Tensor& tol);

// ---- the grids ----------------------------------------------------------------------------
struct PermuteCase {
  torch::ScalarType dtype;
  int64_t tokens, experts, k;
};
struct PlanCase {
  int64_t tokens, experts, k;
};
struct RouterCase {
  torch::ScalarType dtype;  // of the activations the fp32 logits come from (bf16 makes ties)
  int64_t tokens, experts, k;
  bool sigmoid, bias;
};
// dtype {fp32, bf16, fp16} x T {1, 7, 4096, 65537} x E {1, 8, 64, 256} x k {1, 2, 8}, k <= E.
std::vector<PermuteCase> permute_cases();
std::vector<PlanCase> plan_cases();
// The permute grid's shapes; fp32 also with sigmoid scores and with an expert bias.
std::vector<RouterCase> router_cases();
std::string case_name(const PermuteCase& c);
std::string case_name(const PlanCase& c);
std::string case_name(const RouterCase& c);

// ---- permute / unpermute-combine (src/kernels/permute.cu) -----------------------------------
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
// stable-sort reference moe::plan_dispatch).
std::vector<Verdict> check_plan(const torch::Tensor& topk_idx, int64_t num_experts,
                                const PlanOutputs& got);

// ---- fused router (src/kernels/router.cu) ---------------------------------------------------
struct RouterInputs {
  int64_t k = 1;
  bool sigmoid = false, normalize = true;
  torch::Tensor logits;       // [T, E] fp32
  torch::Tensor bias;         // [E] fp32 or undefined
  torch::Tensor grad_probs;   // [T, E] fp32 upstream gradients for the backward
  torch::Tensor grad_weight;  // [T, k]
  torch::Tensor grad_lse;     // [T]
};
RouterInputs make_router_inputs(const RouterCase& c, const torch::Device& device);

struct RouterOutputs {
  torch::Tensor probs, topk_idx, topk_weight, lse, tokens_per_expert;
  torch::Tensor grad_logits;  // the backward, from these forward outputs and the input grads
};
// Verdicts: "probs", "lse", "selection", "topk_weight", "tokens_per_expert", "grad_logits".
// `ties` (optional): tokens whose selection differs from the reference's ranking but stays
// within the tie gap (allowed; reported).
std::vector<Verdict> check_router(const RouterInputs& in, const RouterOutputs& out,
                                  int64_t* ties = nullptr);

// ---- grouped-GEMM experts (at::_grouped_mm, bf16) -------------------------------------------
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
};
ExpertsInputs make_experts_inputs(int64_t experts, const torch::Device& device);
struct ExpertsOutputs {
  torch::Tensor y, grad_x, grad_w_gate, grad_w_up, grad_w_down;
};
// Verdicts: "y", "grad_x", "grad_w_gate", "grad_w_up", "grad_w_down".
std::vector<Verdict> check_experts(const ExpertsInputs& in, const ExpertsOutputs& out);

}  // namespace moe::kernel_checks
