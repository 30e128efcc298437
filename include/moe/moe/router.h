// Router: linear gate -> scores (fp32 whatever the autocast dtype) -> top-k experts and weights,
// per-expert counts, load-balancing and z losses. Ties between equal scores: lower expert id wins.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "moe/config/choices.h"
#include "moe/moe/moe_math.h"

namespace moe::moe {

struct RouterOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 8;
  int64_t top_k = 2;
  config::ScoreFunction score_function = config::ScoreFunction::kSoftmax;  // moe.score_function
  bool normalize_topk = true;
  double capacity_factor = 0.0;  // 0 = dropless
  // Aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the scores for selection
  // only, moved by this much towards balance once per optimizer step. 0 = off.
  double router_bias_update_rate = 0.0;
  bool bias = false;  // a learned bias on the logits (gpt-oss's router.bias; moe.router_bias)
  bool softmax_after_topk = false;  // moe.softmax_after_topk (always the ATen form)
  // Group-limited selection (moe.n_group, moe.topk_group; in the fused kernel up to 32 groups,
  // else the ATen form) and the weights' scale (moe.routed_scaling_factor, after normalisation).
  int64_t n_group = 1, topk_group = 1;
  int64_t group_score_experts = 2;  // a group's key: the sum of its this many best keys
  double routed_scaling_factor = 1.0;
  // Gemma 4 (moe.router_input_norm): the input through a weightless RMSNorm (eps norm_eps) times
  // a learned [hidden] input_scale times hidden^-0.5 before the gate; (moe.per_expert_scale) the
  // final weights times a learned [E] expert_scale at the chosen ids.
  bool input_norm = false;
  bool per_expert_scale = false;
  double norm_eps = 1e-6;
  // Scores and selection in our fused CUDA kernel (moe/kernels/router.h) instead of the ATen
  // reference; settled when the layer is built (resolve_kernel_path in dispatcher.h).
  bool fused_kernel = false;
  // Data parallel: the expert counts of the aux loss summed over the ranks (moe_math.h).
  LoadReduction load_reduction;
};

struct Routing {
  torch::Tensor logits;             // [T, E] fp32
  torch::Tensor topk_idx;           // [T, k] int64 expert ids
  torch::Tensor topk_weight;        // [T, k] fp32 gate weights (0 where dropped)
  torch::Tensor keep;               // [T, k] bool: assignment survives the capacity limit
  torch::Tensor tokens_per_expert;  // [E] int64 kept assignments per expert
  torch::Tensor aux_loss;           // scalar fp32
  torch::Tensor z_loss;             // scalar fp32
  int64_t dropped = 0;              // assignments dropped by capacity
  bool all_kept = true;             // no capacity limit applied (dropless, or capacity >= T * k)
};

// Scores and selection from fp32 logits [T, E], the ATen reference: the part of the router that
// the CUDA kernel of the same name, moe::kernels::score_and_select (moe/kernels/router.h),
// replaces, with the same contract.
//   probs  [T, E] softmax(logits), or sigmoid(logits)
//   topk   the k highest probs + bias (bias: undefined or [E], selection only; ties -> lower id)
//   weight probs at the chosen ids, divided by their sum when normalize && (k > 1 || sigmoid)
//   lse    [T] logsumexp(logits) (the z-loss is mean(lse^2))
//   tokens_per_expert  [E] int64 bincount of topk_idx
// The one result type of both implementations (the kernel's is converted in router.cpp).
struct RouterScores {
  torch::Tensor probs, topk_idx, topk_weight, lse, tokens_per_expert;
};
// With n_group > 1 (DeepSeek's group-limited routing): the experts form n_group equal groups of
// consecutive ids; a group's key is the sum of its group_score_experts highest keys (probs +
// bias; V3 and GLM-4.5: 2, V2: 1), the topk_group best groups are kept (ties -> lower group id)
// and the k experts chosen among them.
RouterScores score_and_select(const torch::Tensor& logits, const torch::Tensor& bias, int64_t k,
                              bool sigmoid_scores, bool normalize_topk, int64_t n_group = 1,
                              int64_t topk_group = 1, int64_t group_score_experts = 2);
// The selection half of score_and_select, from given scores probs [T, E]: topk_idx [T, k] and
// topk_weight [T, k] (differentiable through probs), as above. The kernel's tests compare its
// choice with this one on the kernel's own scores.
std::pair<torch::Tensor, torch::Tensor> select_experts(const torch::Tensor& probs,
                                                       const torch::Tensor& bias, int64_t k,
                                                       bool sigmoid_scores, bool normalize_topk,
                                                       int64_t n_group = 1, int64_t topk_group = 1,
                                                       int64_t group_score_experts = 2);
// moe.softmax_after_topk: the k highest logits (ties -> lower id), weights = softmax over those
// k; probs, lse and tokens_per_expert as above (the aux and z losses are unchanged).
RouterScores softmax_after_topk(const torch::Tensor& logits, int64_t k);

class RouterImpl : public torch::nn::Module {
 public:
  explicit RouterImpl(const RouterOptions& opt);
  // x [T, hidden] (on a GPU when options().fused_kernel).
  Routing forward(const torch::Tensor& x);
  const RouterOptions& options() const { return opt_; }
  // Aux-loss-free balancing: bias_e += rate * sign(mean load - load_e), tokens_per_expert [E]
  // counted over the whole optimizer step. A no-op when router_bias_update_rate is 0.
  void update_expert_bias(const torch::Tensor& tokens_per_expert);
  torch::Tensor weight;        // [E, hidden], xavier_uniform
  torch::Tensor bias;          // [E] zeros (moe.router_bias only)
  torch::Tensor input_scale;   // [hidden] ones (moe.router_input_norm only)
  torch::Tensor expert_scale;  // [E] ones (moe.per_expert_scale only)
  torch::Tensor expert_bias;   // [E] fp32 buffer (zeros; not a parameter, never decayed)

 private:
  // How many ranks' micro-batches a capacity limit covers: every rank's in training with data
  // parallelism (their assignments ranked together), else 1.
  int64_t capacity_ranks() const;
  // The capacity mask [T, k]: over this rank's assignments, or in training over every rank's.
  torch::Tensor keep_within_capacity(const torch::Tensor& topk_idx,
                                     const torch::Tensor& topk_weight) const;
  RouterOptions opt_;
};
TORCH_MODULE(Router);

// Reference top-k with the project's tie rule (stable descending sort: lower id first).
std::pair<torch::Tensor, torch::Tensor> topk_lower_id_wins(const torch::Tensor& scores, int64_t k);

// Capacity mask: per expert keep the `capacity` highest-weight assignments; ties go to the
// earlier assignment (t * k + j). Returns keep [T, k] bool.
torch::Tensor capacity_keep_mask(const torch::Tensor& topk_idx, const torch::Tensor& topk_weight,
                                 int64_t num_experts, int64_t capacity);

}  // namespace moe::moe
