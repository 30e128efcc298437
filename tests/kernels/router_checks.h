// The oracle and comparisons of the router family (src/kernels/router.cu: score_and_select),
// shared by router_gpu_test.cpp and router_emulation_test.cpp.
#pragma once

#include <torch/types.h>

#include <vector>

#include "check_util.h"

namespace moe::kernel_checks {

struct ScoreAndSelectInputs {
  int64_t k = 1;
  bool sigmoid = false, normalize = true;
  torch::Tensor logits;       // [T, E] fp32
  torch::Tensor bias;         // [E] fp32 or undefined
  torch::Tensor grad_probs;   // [T, E] fp32 upstream gradients for the backward
  torch::Tensor grad_weight;  // [T, k]
  torch::Tensor grad_lse;     // [T]
};
ScoreAndSelectInputs make_score_and_select_inputs(const RouterCase& c, const torch::Device& device);

struct ScoreAndSelectOutputs {
  torch::Tensor probs, topk_idx, topk_weight, lse, tokens_per_expert;
  torch::Tensor grad_logits;  // the backward, from these forward outputs and the input grads
};
// Verdicts: "probs", "lse", "selection", "topk_weight", "tokens_per_expert", "grad_logits".
// `ties` (optional): tokens whose selection differs from the reference's ranking but stays
// within the tie gap (allowed; reported).
std::vector<Verdict> check_score_and_select(const ScoreAndSelectInputs& in,
                                            const ScoreAndSelectOutputs& out,
                                            int64_t* ties = nullptr);

}  // namespace moe::kernel_checks
