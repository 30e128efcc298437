// The router (router.h): the ATen reference score_and_select, the choice between it and the CUDA
// kernel of the same name, capacity dropping and the router losses.
#include "moe/moe/router.h"

#include <torch/nn/init.h>
#include <torch/torch.h>

#include <limits>
#include <tuple>
#include <utility>

#include "moe/kernels/router.h"
#include "moe/moe/moe_math.h"

namespace moe::moe {

RouterImpl::RouterImpl(const RouterOptions& opt) : opt_(opt) {
  weight = register_parameter("weight", torch::empty({opt.num_experts, opt.hidden_size}));
  torch::nn::init::xavier_uniform_(weight);
  if (opt.bias) bias = register_parameter("bias", torch::zeros({opt.num_experts}));
  if (opt.input_norm)
    input_scale = register_parameter("input_scale", torch::ones({opt.hidden_size}));
  if (opt.per_expert_scale) {
    expert_scale = register_parameter("expert_scale", torch::ones({opt.num_experts}));
  }
  expert_bias = register_buffer("expert_bias", torch::zeros({opt.num_experts}));
}

void RouterImpl::update_expert_bias(const torch::Tensor& tokens_per_expert) {
  if (opt_.router_bias_update_rate <= 0) return;
  torch::NoGradGuard no_grad;
  auto load = tokens_per_expert.to(expert_bias.device(), torch::kFloat);
  expert_bias.add_(torch::sign(load.mean() - load), opt_.router_bias_update_rate);
}

namespace {
// Keys outside the topk_group best groups set to -inf: a group's key is the sum of its `scored`
// highest keys (transformers' DeepseekV3TopkRouter: topk(2).sum; DeepseekV2's
// group_limited_greedy: max), groups chosen lower id first on ties, as the experts are.
torch::Tensor keep_best_groups(const torch::Tensor& keys, int64_t n_group, int64_t topk_group,
                               int64_t scored) {
  const int64_t T = keys.size(0), E = keys.size(1);
  const auto grouped = keys.view({T, n_group, E / n_group});
  const auto group_keys = scored == 1 ? std::get<0>(grouped.max(-1))  // the max, exactly
                                      : std::get<0>(at::topk(grouped, scored, -1)).sum(-1);
  const auto best = topk_lower_id_wins(group_keys, topk_group).second;  // [T, topk_group]
  auto chosen = torch::zeros({T, n_group}, keys.options().dtype(torch::kBool));
  chosen.scatter_(1, best, true);
  return grouped
      .masked_fill(chosen.logical_not().unsqueeze(-1), -std::numeric_limits<float>::infinity())
      .view({T, E});
}
}  // namespace

std::pair<torch::Tensor, torch::Tensor> select_experts(const torch::Tensor& probs,
                                                       const torch::Tensor& bias, int64_t k,
                                                       bool sigmoid_scores, bool normalize_topk,
                                                       int64_t n_group, int64_t topk_group,
                                                       int64_t group_score_experts) {
  auto keys = bias.defined() ? probs.detach() + bias : probs.detach();
  // NaN keys (a diverging step) rank lowest, as in the fused kernel: at::sort would put them
  // first; as -inf they tie with real -inf keys, and ties go to the lower id on both paths.
  keys = keys.masked_fill(keys.isnan(), -std::numeric_limits<float>::infinity());
  if (n_group > 1) keys = keep_best_groups(keys, n_group, topk_group, group_score_experts);
  auto topk_idx = topk_lower_id_wins(keys, k).second;
  auto topk_weight = probs.gather(-1, topk_idx);
  if (normalize_topk && (k > 1 || sigmoid_scores)) {
    topk_weight = topk_weight / topk_weight.sum(-1, true).clamp_min(1e-20);
  }
  return {topk_idx, topk_weight};
}

RouterScores score_and_select(const torch::Tensor& logits, const torch::Tensor& bias, int64_t k,
                              bool sigmoid_scores, bool normalize_topk, int64_t n_group,
                              int64_t topk_group, int64_t group_score_experts) {
  RouterScores s;
  s.probs = sigmoid_scores ? torch::sigmoid(logits) : torch::softmax(logits, -1);
  std::tie(s.topk_idx, s.topk_weight) = select_experts(
      s.probs, bias, k, sigmoid_scores, normalize_topk, n_group, topk_group, group_score_experts);
  s.lse = at::logsumexp(logits, -1);
  s.tokens_per_expert = at::bincount(s.topk_idx.reshape(-1), {}, logits.size(-1));
  return s;
}

RouterScores softmax_after_topk(const torch::Tensor& logits, int64_t k) {
  RouterScores s;
  s.probs = torch::softmax(logits, -1);
  const auto keys =
      logits.detach().masked_fill(logits.detach().isnan(), -std::numeric_limits<float>::infinity());
  s.topk_idx = topk_lower_id_wins(keys, k).second;
  s.topk_weight = torch::softmax(logits.gather(-1, s.topk_idx), -1);
  s.lse = at::logsumexp(logits, -1);
  s.tokens_per_expert = at::bincount(s.topk_idx.reshape(-1), {}, logits.size(-1));
  return s;
}

namespace {
RouterScores score_and_select_fused(const torch::Tensor& logits, const torch::Tensor& bias,
                                    int64_t k, bool sigmoid_scores, bool normalize_topk,
                                    int64_t n_group, int64_t topk_group,
                                    int64_t group_score_experts) {
  auto f = kernels::score_and_select(logits, bias, k, sigmoid_scores, normalize_topk, n_group,
                                     topk_group, group_score_experts);
  return {f.probs, f.topk_idx, f.topk_weight, f.lse, f.tokens_per_expert};
}

// The kernel's expert groups: at most one per lane of its warp, group keys from 1 or 2 experts.
bool kernel_has_groups(const RouterOptions& o) {
  return o.n_group <= 1 ||
         (o.n_group <= 32 && (o.group_score_experts == 1 || o.group_score_experts == 2));
}
}  // namespace

std::pair<torch::Tensor, torch::Tensor> topk_lower_id_wins(const torch::Tensor& scores, int64_t k) {
  auto [values, indices] = at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  return {values.narrow(-1, 0, k), indices.narrow(-1, 0, k)};
}

torch::Tensor capacity_keep_mask(const torch::Tensor& topk_idx, const torch::Tensor& topk_weight,
                                 int64_t num_experts, int64_t capacity) {
  const int64_t n = topk_idx.numel();
  auto flat_e = topk_idx.reshape(-1);
  auto flat_w = topk_weight.detach().reshape(-1);
  // Order: by expert, then weight descending, then assignment index (two stable sorts).
  auto by_w = std::get<1>(at::sort(flat_w, /*stable=*/true, 0, /*descending=*/true));
  auto by_e = std::get<1>(at::sort(flat_e.index_select(0, by_w), /*stable=*/true, 0, false));
  auto order = by_w.index_select(0, by_e);
  auto sorted_e = flat_e.index_select(0, order);
  auto counts = at::bincount(sorted_e, {}, num_experts);
  auto starts = counts.cumsum(0) - counts;
  auto rank = torch::arange(n, topk_idx.options()) - starts.index_select(0, sorted_e);
  auto keep_sorted = rank < capacity;
  auto keep = torch::empty({n}, topk_idx.options().dtype(torch::kBool));
  keep.index_put_({order}, keep_sorted);
  return keep.view_as(topk_idx);
}

// Training with several ranks: the capacity covers the global micro-batch and every rank's
// assignments are ranked together (gathered in rank order, the order of one process's batch),
// so the same assignments survive at any world size; each rank keeps its own rows of the mask.
int64_t RouterImpl::capacity_ranks() const {
  const LoadReduction& ranks = opt_.load_reduction;
  return ranks.gather_over_ranks && is_training() ? std::max<int64_t>(1, ranks.world_size) : 1;
}

torch::Tensor RouterImpl::keep_within_capacity(const torch::Tensor& topk_idx,
                                               const torch::Tensor& topk_weight) const {
  const LoadReduction& ranks = opt_.load_reduction;
  const int64_t T = topk_idx.size(0), E = opt_.num_experts, k = opt_.top_k, W = capacity_ranks();
  if (W == 1) {
    return capacity_keep_mask(topk_idx, topk_weight, E,
                              expert_capacity(T, k, E, opt_.capacity_factor));
  }
  const auto all_idx = ranks.gather_over_ranks(topk_idx.contiguous());
  const auto all_w = ranks.gather_over_ranks(topk_weight.detach().to(torch::kFloat).contiguous());
  const auto keep =
      capacity_keep_mask(all_idx, all_w, E, expert_capacity(W * T, k, E, opt_.capacity_factor));
  return keep.narrow(0, ranks.rank * T, T).contiguous();
}

Routing RouterImpl::forward(const torch::Tensor& x) {
  Routing r;
  const int64_t T = x.size(0), E = opt_.num_experts, k = opt_.top_k;
  {
    // Router math in fp32 whatever the surrounding autocast dtype.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto in = x.to(torch::kFloat);
    if (opt_.input_norm) {  // transformers' Gemma4TextRouter: norm, times scale, times d^-0.5
      in = at::rms_norm(in, {in.size(-1)}, {}, opt_.norm_eps) * input_scale.to(torch::kFloat) *
           std::pow(static_cast<double>(opt_.hidden_size), -0.5);
    }
    r.logits = torch::nn::functional::linear(in, weight.to(torch::kFloat),
                                             bias.defined() ? bias.to(torch::kFloat) : bias);
  }
  // The selection bias always takes part: updated (aux-loss-free balancing) or imported
  // (DeepSeek-V3 / GLM-4.5 / MiniMax-M2's e_score_correction_bias on sigmoid scores, ERNIE 4.5's
  // moe_statics on softmax ones), trained or frozen. A zero bias changes no selection.
  const bool sigmoid = opt_.score_function == config::ScoreFunction::kSigmoid;
  const torch::Tensor& selection_bias = expert_bias;
  RouterScores s;
  if (opt_.softmax_after_topk) {
    s = softmax_after_topk(r.logits, k);
  } else if (!opt_.fused_kernel || !kernel_has_groups(opt_) ||
             E > kernels::kRouterKernelMaxExperts || k > kernels::kRouterKernelMaxTopK) {
    s = score_and_select(r.logits, selection_bias, k, sigmoid, opt_.normalize_topk, opt_.n_group,
                         opt_.topk_group, opt_.group_score_experts);
  } else {
    s = score_and_select_fused(r.logits, selection_bias, k, sigmoid, opt_.normalize_topk,
                               opt_.n_group, opt_.topk_group, opt_.group_score_experts);
  }
  const torch::Tensor &scores = s.probs, &top_idx = s.topk_idx, &lse = s.lse;
  torch::Tensor w = s.topk_weight, counts = s.tokens_per_expert;
  if (opt_.routed_scaling_factor != 1.0) w = w * opt_.routed_scaling_factor;
  if (expert_scale.defined())
    w = w * expert_scale.to(torch::kFloat).index_select(0, top_idx.flatten()).view_as(w);
  r.topk_idx = top_idx;
  // A limit that binds for the micro-batch it covers (every rank's in training: see above).
  const int64_t W = capacity_ranks();
  const bool limited = expert_capacity(W * T, k, E, opt_.capacity_factor) < W * T * k;
  if (limited) {
    r.keep = keep_within_capacity(top_idx, w);
    w = w * r.keep.to(w.scalar_type());
  } else {
    r.keep = torch::ones_like(top_idx, top_idx.options().dtype(torch::kBool));
  }
  r.topk_weight = w;
  if (limited) {
    auto kept_idx = top_idx.masked_select(r.keep);
    counts = at::bincount(kept_idx, {}, E);
  }
  r.tokens_per_expert = counts;
  r.all_kept = !limited;
  // Only a capacity limit drops; dropless routing needs no host sync here.
  r.dropped = r.all_kept ? 0 : T * k - counts.sum().item<int64_t>();
  // Aux loss on the probability simplex: softmax scores, or sigmoid scores normalised per token.
  auto probs = sigmoid ? scores / scores.sum(-1, true).clamp_min(1e-20) : scores;
  const auto [counts_all, ranks] =
      global_load_counts(r.tokens_per_expert, is_training(), opt_.load_reduction);
  r.aux_loss = load_balancing_loss(probs, counts_all, k, T * ranks);
  r.z_loss = lse.square().mean();  // router_z_loss(logits), from the lse already computed
  return r;
}

}  // namespace moe::moe
