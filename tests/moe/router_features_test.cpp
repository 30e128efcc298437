// Router features beyond plain top-k: the aux-loss-free expert bias (selection only, updated from
// loads), the shared expert, and the score_and_select contract the CUDA kernel follows.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <array>
#include <limits>
#include <vector>

#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/moe/moe_layer.h"
#include "moe/moe/router.h"

namespace moe::moe {
namespace {

TEST(ExpertBias, ChangesSelectionNotWeights) {
  auto logits = torch::tensor({{2.0, 1.0, 0.5, 0.0}}, torch::kFloat);
  auto bias = torch::tensor({0.0, 0.0, 0.0, 1.0}, torch::kFloat);
  auto plain = score_and_select(logits, torch::Tensor(), 2, false, true);
  auto biased = score_and_select(logits, bias, 2, false, true);
  EXPECT_TRUE(torch::equal(plain.topk_idx, torch::tensor({{0, 1}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(biased.topk_idx, torch::tensor({{3, 0}}, torch::kLong)));
  // Weights come from the unbiased probabilities of the chosen experts, renormalised.
  auto p = torch::softmax(logits, -1);
  auto expect = torch::stack({p[0][3], p[0][0]}).unsqueeze(0);
  expect = expect / expect.sum(-1, true);
  EXPECT_TRUE(torch::allclose(biased.topk_weight, expect, 1e-6, 1e-7));
  // Ties after the bias still go to the lower id.
  auto tie = score_and_select(torch::zeros({1, 4}), torch::zeros({4}), 1, false, true);
  EXPECT_EQ(tie.topk_idx.item<int64_t>(), 0);
  // lse is the z-loss input: logsumexp of the logits.
  EXPECT_TRUE(torch::allclose(plain.lse, torch::logsumexp(logits, -1)));
}

TEST(ExpertBias, UpdateFollowsSignOfLoadDeficit) {
  RouterOptions o;
  o.hidden_size = 8;
  o.num_experts = 4;
  o.router_bias_update_rate = 0.01;
  Router r(o);
  r->update_expert_bias(torch::tensor({10, 0, 5, 5}, torch::kLong));
  EXPECT_TRUE(torch::allclose(r->expert_bias, torch::tensor({-0.01f, 0.01f, 0.0f, 0.0f})));
  RouterOptions off = o;
  off.router_bias_update_rate = 0;
  Router r2(off);
  r2->update_expert_bias(torch::tensor({10, 0, 5, 5}, torch::kLong));
  EXPECT_EQ(r2->expert_bias.abs().sum().item<float>(), 0.0f);
}

// A router skewed towards one expert balances its load through the bias alone.
TEST(ExpertBias, BalancesASkewedRouter) {
  torch::manual_seed(5);
  RouterOptions o;
  o.hidden_size = 16;
  o.num_experts = 8;
  o.top_k = 2;
  o.router_bias_update_rate = 0.005;
  Router r(o);
  {
    torch::NoGradGuard g;
    r->weight[0].add_(0.1);  // expert 0 wins most tokens
  }
  auto x = torch::randn({512, 16}).abs();
  auto spread = [&] {
    auto c = r->forward(x).tokens_per_expert.to(torch::kFloat);
    return (c.max() - c.min()).item<float>() / c.mean().item<float>();
  };
  const float before = spread();
  for (int i = 0; i < 300; ++i) r->update_expert_bias(r->forward(x).tokens_per_expert);
  const float after = spread();
  EXPECT_GT(before, 1.0f);
  EXPECT_LT(after, 0.5f * before) << "before " << before << " after " << after;
}

// transformers' DeepseekV3TopkRouter selection, written as it is there (topk(2).sum per group,
// topk over groups, masked_fill(-inf), topk over experts), as an independent formulation of
// the one score_and_select implements with stable sorts.
torch::Tensor hf_group_limited_topk(const torch::Tensor& scores_for_choice, int64_t n_group,
                                    int64_t topk_group, int64_t k) {
  const int64_t T = scores_for_choice.size(0), E = scores_for_choice.size(1);
  auto group_scores =
      std::get<0>(scores_for_choice.view({T, n_group, E / n_group}).topk(2, -1)).sum(-1);
  auto group_idx = std::get<1>(torch::topk(group_scores, topk_group, -1, true, false));
  auto group_mask = torch::zeros_like(group_scores).scatter_(1, group_idx, 1);
  auto score_mask = group_mask.unsqueeze(-1).expand({T, n_group, E / n_group}).reshape({T, E});
  auto masked = scores_for_choice.masked_fill(score_mask.logical_not(),
                                              -std::numeric_limits<float>::infinity());
  return std::get<1>(torch::topk(masked, k, -1, true, false));
}

TEST(ExpertGroups, SelectionMatchesTransformersRule) {
  torch::manual_seed(7);
  // DeepSeek-V3's shape scaled down (32 experts in 8 groups, 4 kept, top 8), one group kept,
  // uneven group counts, and every group kept (no masking).
  for (auto [E, n_group, topk_group, k] : std::vector<std::array<int64_t, 4>>{
           {32, 8, 4, 8}, {16, 4, 1, 2}, {64, 8, 3, 6}, {8, 2, 2, 4}}) {
    const auto logits = torch::randn({97, E});
    const auto bias = torch::randn({E}) * 0.2;
    const auto s = score_and_select(logits, bias, k, /*sigmoid=*/true, /*normalize=*/true, n_group,
                                    topk_group);
    const auto probs = torch::sigmoid(logits);
    const auto want = hf_group_limited_topk(probs + bias, n_group, topk_group, k);
    // The same expert sets (transformers' topk is unsorted; ours is by key, ties lower id).
    EXPECT_TRUE(torch::equal(std::get<0>(s.topk_idx.sort(-1)), std::get<0>(want.sort(-1))))
        << "E " << E << " groups " << n_group << "/" << topk_group << " k " << k;
    // Each token's experts lie in at most topk_group groups.
    const auto gid = torch::floor_divide(s.topk_idx, E / n_group);
    const auto groups_used = torch::zeros({97, n_group}).scatter_(1, gid, 1.0).sum(-1);
    EXPECT_LE(groups_used.max().item<float>(), static_cast<float>(topk_group));
    // Weights: the unbiased sigmoid scores of the chosen experts, renormalised.
    auto w = probs.gather(-1, s.topk_idx);
    w = w / w.sum(-1, true);
    EXPECT_TRUE(torch::allclose(s.topk_weight, w, 1e-6, 1e-7));
  }
}

TEST(ExpertGroups, AGroupsBestPairOutranksOneStrongExpert) {
  // Group 0 holds the single best expert (0.9) but its pair sums to 0.9 + 0.0; group 1's pair
  // sums to 0.6 + 0.6: with one group kept, experts 2 and 3 are chosen, not expert 0.
  const auto logits = torch::logit(torch::tensor({{0.9, 0.0001, 0.6, 0.6}}, torch::kFloat));
  const auto s = score_and_select(logits, torch::Tensor(), 2, true, true, 2, 1);
  EXPECT_TRUE(torch::equal(std::get<0>(s.topk_idx.sort(-1)), torch::tensor({{2, 3}})));
  // Without groups the best two are 0 and one of 2, 3 (ties: lower id).
  const auto flat = score_and_select(logits, torch::Tensor(), 2, true, true);
  EXPECT_TRUE(torch::equal(flat.topk_idx, torch::tensor({{0, 2}})));
}

TEST(ExpertGroups, RoutedScalingFactorScalesTheRoutedWeightsOnly) {
  RouterOptions o;
  o.hidden_size = 16;
  o.num_experts = 8;
  o.top_k = 2;
  o.score_function = config::ScoreFunction::kSigmoid;
  o.n_group = 4;
  o.topk_group = 2;
  torch::manual_seed(3);
  Router plain(o);
  o.routed_scaling_factor = 2.5;
  Router scaled(o);
  {
    torch::NoGradGuard g;
    scaled->weight.copy_(plain->weight);
  }
  const auto x = torch::randn({33, 16});
  const auto a = plain->forward(x), b = scaled->forward(x);
  EXPECT_TRUE(torch::equal(a.topk_idx, b.topk_idx));
  EXPECT_TRUE(torch::allclose(b.topk_weight, a.topk_weight * 2.5, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(a.topk_weight.sum(-1), torch::ones({33}), 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(a.aux_loss, b.aux_loss));  // the aux loss reads the scores, not weights
}

TEST(SharedExpert, AddsADenseSwiGluToEveryToken) {
  torch::manual_seed(2);
  MoeLayerOptions o;
  o.router.hidden_size = 16;
  o.router.num_experts = 4;
  o.router.top_k = 2;
  o.experts.num_experts = 4;
  o.experts.hidden_size = 16;
  o.experts.ffn_size = 32;
  o.shared_expert_hidden_size = 24;
  MoeLayer layer(o);
  ASSERT_TRUE(layer->shared_expert);
  auto x = torch::randn({9, 16});
  auto y = layer->forward(x).y;
  // Without the shared expert: the same layer minus its dense term.
  auto s = layer->shared_expert;
  auto dense =
      torch::matmul(torch::silu(x.matmul(s->w_gate[0])) * x.matmul(s->w_up[0]), s->w_down[0]);
  MoeLayerOptions no_shared = o;
  no_shared.shared_expert_hidden_size = 0;
  MoeLayer plain(no_shared);
  {
    torch::NoGradGuard g;
    plain->router->weight.copy_(layer->router->weight);
    plain->experts->w_gate.copy_(layer->experts->w_gate);
    plain->experts->w_up.copy_(layer->experts->w_up);
    plain->experts->w_down.copy_(layer->experts->w_down);
  }
  EXPECT_TRUE(torch::allclose(y, plain->forward(x).y + dense, 1e-5, 1e-6));
  y.sum().backward();
  EXPECT_TRUE(s->w_gate.grad().defined() && s->w_gate.grad().abs().sum().item<float>() > 0);
}

TEST(SharedExpert, ParameterCountMatchesModel) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", 64},
                        {"seq_len", 8},
                        {"hidden_size", 16},
                        {"num_layers", 2},
                        {"num_heads", 2}}},
                      {"moe",
                       {{"num_experts", 4},
                        {"top_k", 2},
                        {"expert_hidden_size", 32},
                        {"shared_expert_hidden_size", 48},
                        {"router_bias_update_rate", 0.001}}},
                      {"data", {{"train_path", "unused.h5"}}},
                      {"training", {{"output_dir", "unused"}}}};
  config::Config cfg = config::from_json(j, "shared.json");
  config::validate(cfg);
  model::TransformerLM m(cfg);
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, config::count_parameters(cfg));
  // The bias is a buffer: not trained by the optimizer, not in the parameter count.
  int64_t biases = 0;
  for (const auto& b : m->named_buffers())
    biases += b.key().find("expert_bias") != std::string::npos;
  EXPECT_EQ(biases, 2);
}

}  // namespace
}  // namespace moe::moe
