// Router: linear gate -> scores (fp32 whatever the autocast dtype) -> top-k experts and weights,
// per-expert counts, load-balancing and z losses. Ties between equal scores: lower expert id wins.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

namespace moe::moe {

struct RouterOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 8;
  int64_t top_k = 2;
  bool sigmoid_scores = false;  // default softmax
  bool normalize_topk = true;
  double capacity_factor = 0.0;  // 0 = dropless
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
};

class RouterImpl : public torch::nn::Module {
 public:
  explicit RouterImpl(const RouterOptions& opt);
  Routing forward(const torch::Tensor& x);  // x [T, hidden]
  const RouterOptions& options() const { return opt_; }
  torch::Tensor weight;  // [E, hidden], xavier_uniform

 private:
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
