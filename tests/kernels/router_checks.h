// The oracle and comparisons of the router family (src/kernels/router.cu: score_and_select),
// shared by router_gpu_test.cpp and router_emulation_test.cpp.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

struct ScoreAndSelectInputs {
  int64_t k = 1;
  bool sigmoid = false, normalize = true;
  // Group-limited selection (moe::score_and_select's n_group, topk_group, group_score_experts).
  int64_t n_group = 1, topk_group = 1, group_score_experts = 2;
  torch::Tensor logits;       // [T, E] fp32
  torch::Tensor bias;         // [E] fp32 or undefined
  torch::Tensor grad_probs;   // [T, E] fp32 upstream gradients for the backward
  torch::Tensor grad_weight;  // [T, k]
  torch::Tensor grad_lse;     // [T]
};
ScoreAndSelectInputs make_score_and_select_inputs(const RouterCase& c, const torch::Device& device);

// Group-limited selection's cases: the models' shapes (DeepSeek-V3, GLM-4.5's single group,
// DeepSeek-V2's group_limited_greedy) and the edges (32 groups, groups across lanes, k beyond the
// kept experts, ties on a coarse grid, NaN and infinite logits, an infinite bias).
enum class RouterLogits {
  kRandom,  // randn * 2
  kCoarse,  // a grid of 7 values (and a bias on a grid of 3): ties between experts and groups
  kNan,     // rows of NaN, of some NaN, a NaN group, +-inf logits, the coarse grid, in turn
};
struct RouterGroupCase {
  std::string name;
  int64_t tokens, experts, k, n_group, topk_group, group_score_experts;
  bool sigmoid, bias, normalize;
  RouterLogits logits = RouterLogits::kRandom;
  bool inf_bias = false;  // group 1: one expert's bias +inf, the others' -inf (a NaN group key)
};
// Every case's k is one whose normalising sum ATen's CPU reduction takes in the kernel's order
// (k <= 4, or 8), or its weights are not normalised, so that weights compare bitwise.
std::vector<RouterGroupCase> router_group_cases();
ScoreAndSelectInputs make_score_and_select_inputs(const RouterGroupCase& c,
                                                  const torch::Device& device);
// Whether every logit and score is finite (check_score_and_select's tolerances need that).
bool finite_inputs(const RouterGroupCase& c);

struct ScoreAndSelectOutputs {
  torch::Tensor probs, topk_idx, topk_weight, lse, tokens_per_expert;
  torch::Tensor grad_logits;  // the backward, from these forward outputs and the input grads
};
// Verdicts: "probs", "lse", "selection", "topk_weight", "tokens_per_expert", "grad_logits".
// `ties` (optional): tokens whose selection differs from the reference's ranking but stays
// within the tie gap (allowed; reported). With n_group > 1 the selection must be the reference's
// (moe::select_experts) on the output's own probs, exactly (ties = 0): a group's key sums two
// keys and decides which experts compete, so no tie gap bounds what a rounding may move.
std::vector<Verdict> check_score_and_select(const ScoreAndSelectInputs& in,
                                            const ScoreAndSelectOutputs& out,
                                            int64_t* ties = nullptr);

// The output against the ATen reference's selection (moe::select_experts, on the device of the
// output's probs) from the output's own probs, bit for bit: "reference_ids", "reference_weights"
// (the reference's weights computed on the CPU, whose sum takes the kernel's order for the k of
// router_group_cases; NaN matches NaN), "reference_counts" (bincount of the reference's ids).
std::vector<Verdict> check_against_reference(const ScoreAndSelectInputs& in,
                                             const ScoreAndSelectOutputs& out);

}  // namespace moe::kernel_checks
