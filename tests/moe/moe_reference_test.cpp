// The ATen reference MoE path against naive per-token loops, plus gradient checks in double.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "moe/moe/dispatcher.h"
#include "moe/moe/moe_layer.h"
#include "moe/moe/moe_math.h"
#include "moe/moe/router.h"

namespace moe::moe {
namespace {

TEST(Router, TopkTiesGoToLowerExpertId) {
  auto scores = torch::tensor({{0.25, 0.25, 0.25, 0.25}, {0.1, 0.4, 0.1, 0.4}}, torch::kFloat);
  auto [v, idx] = topk_lower_id_wins(scores, 2);
  EXPECT_TRUE(torch::equal(idx, torch::tensor({{0, 1}, {1, 3}}, torch::kLong)));
  auto [v1, idx1] = topk_lower_id_wins(scores, 1);
  EXPECT_TRUE(torch::equal(idx1, torch::tensor({{0}, {1}}, torch::kLong)));
}

// Naive per-token loop: for each token, the k best experts (lower id on ties).
TEST(Router, MatchesNaiveLoopForKFromOneToE) {
  torch::manual_seed(0);
  for (int64_t k : {1, 2, 8}) {
    RouterOptions o;
    o.hidden_size = 16;
    o.num_experts = 8;
    o.top_k = k;
    Router r(o);
    auto x = torch::randn({37, 16});
    Routing out = r->forward(x);
    auto probs = torch::softmax(out.logits, -1);
    std::vector<int64_t> counts(8, 0);
    for (int64_t t = 0; t < 37; ++t) {
      std::vector<std::pair<float, int64_t>> row;
      for (int64_t e = 0; e < 8; ++e) row.push_back({probs[t][e].item<float>(), e});
      std::stable_sort(row.begin(), row.end(), [](auto a, auto b) { return a.first > b.first; });
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += row[j].first;
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(out.topk_idx[t][j].item<int64_t>(), row[j].second);
        float expect_w = k > 1 ? row[j].first / sum : row[j].first;
        EXPECT_NEAR(out.topk_weight[t][j].item<float>(), expect_w, 1e-6);
        ++counts[row[j].second];
      }
    }
    for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(out.tokens_per_expert[e].item<int64_t>(), counts[e]);
    EXPECT_EQ(out.dropped, 0);
  }
}

TEST(MoeMath, LoadBalancingLossIsOneWhenUniform) {
  auto probs = torch::full({8, 4}, 0.25);
  auto counts = torch::full({4}, 4, torch::kLong);  // T*k = 16 spread evenly
  EXPECT_NEAR(load_balancing_loss(probs, counts, 2).item<double>(), 1.0, 1e-6);
  EXPECT_EQ(expert_capacity(10, 2, 4, 0.0), 20);
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.25), 7);
  auto logits = torch::zeros({3, 4});
  EXPECT_NEAR(router_z_loss(logits).item<double>(), std::pow(std::log(4.0), 2), 1e-6);
}

TEST(Capacity, DropsLowestWeightFirstDeterministically) {
  // 4 tokens, k = 1, all to expert 0, capacity 2: keep the two highest weights; a tie between
  // equal weights keeps the earlier token.
  auto idx = torch::zeros({4, 1}, torch::kLong);
  auto w = torch::tensor({{0.5}, {0.9}, {0.5}, {0.2}}, torch::kFloat);
  auto keep = capacity_keep_mask(idx, w, 2, 2);
  EXPECT_TRUE(torch::equal(keep.view(-1), torch::tensor({true, true, false, false})));
}

TEST(Dispatcher, StablePermutationAndZeroTokenExperts) {
  // T = 3, k = 2, E = 4; expert 3 receives nothing.
  auto idx = torch::tensor({{2, 0}, {0, 2}, {1, 0}}, torch::kLong);
  auto keep = torch::ones({3, 2}, torch::kBool);
  DispatchPlan p = dispatch_plan(idx, keep, 4);
  EXPECT_TRUE(torch::equal(p.tokens_per_expert, torch::tensor({3, 1, 2, 0}, torch::kLong)));
  // expert 0: assignments 1 (t0), 2 (t1), 5 (t2); expert 1: 4 (t2); expert 2: 0 (t0), 3 (t1)
  EXPECT_TRUE(torch::equal(p.source_assignment, torch::tensor({1, 2, 5, 4, 0, 3}, torch::kLong)));
  EXPECT_TRUE(torch::equal(p.source_token, torch::tensor({0, 1, 2, 2, 0, 1}, torch::kLong)));
}

TEST(Dispatcher, CombineMatchesNaiveLoop) {
  torch::manual_seed(1);
  const int64_t T = 11, k = 3, E = 5, d = 7;
  auto idx = torch::stack({torch::randperm(E).narrow(0, 0, k)}, 0).repeat({T, 1});
  for (int64_t t = 0; t < T; ++t) idx[t] = torch::randperm(E).narrow(0, 0, k);
  auto keep = torch::rand({T, k}) > 0.2;
  auto w = torch::rand({T, k});
  auto x = torch::randn({T, d});
  DispatchPlan p = dispatch_plan(idx, keep, E);
  auto y = permute(x, p) * 2.0;  // a stand-in expert: y = 2x
  auto out = combine(y, p, w * keep, T);
  for (int64_t t = 0; t < T; ++t) {
    auto expect = torch::zeros({d});
    for (int64_t j = 0; j < k; ++j) {
      if (keep[t][j].item<bool>()) expect += w[t][j] * 2.0 * x[t];
    }
    EXPECT_TRUE(torch::allclose(out[t], expect, 1e-5, 1e-6)) << "token " << t;
  }
}

TEST(Dispatcher, GradcheckInDouble) {
  torch::manual_seed(2);
  const int64_t T = 5, k = 2, E = 3, d = 4;
  auto idx = torch::tensor({{0, 1}, {2, 0}, {1, 2}, {0, 2}, {1, 0}}, torch::kLong);
  auto keep = torch::ones({T, k}, torch::kBool);
  DispatchPlan p = dispatch_plan(idx, keep, E);
  auto x = torch::randn({T, d}, torch::kDouble).requires_grad_(true);
  auto w = torch::rand({T, k}, torch::kDouble).requires_grad_(true);
  auto W = torch::randn({d, d}, torch::kDouble);
  // The library functions themselves, composed with a linear stand-in expert.
  auto f = [&](const torch::Tensor& xx, const torch::Tensor& ww) {
    return combine(permute(xx, p).matmul(W), p, ww, T);
  };
  auto out = f(x, w);
  ASSERT_EQ(out.scalar_type(), torch::kDouble);
  auto g = torch::randn_like(out);
  auto grads = torch::autograd::grad({out}, {x, w}, {g});
  const double eps = 1e-6;
  for (int which = 0; which < 2; ++which) {
    const auto& param = which == 0 ? x : w;
    for (int64_t i = 0; i < param.numel(); ++i) {
      auto plus = param.detach().clone(), minus = param.detach().clone();
      plus.view(-1)[i] += eps;
      minus.view(-1)[i] -= eps;
      auto fp = which == 0 ? f(plus, w.detach()) : f(x.detach(), plus);
      auto fm = which == 0 ? f(minus, w.detach()) : f(x.detach(), minus);
      double num = ((fp - fm) * g).sum().item<double>() / (2 * eps);
      EXPECT_NEAR(num, grads[which].view(-1)[i].item<double>(), 1e-6)
          << (which == 0 ? "x" : "w") << "[" << i << "]";
    }
  }
}

MoeLayerOptions small_layer(double capacity) {
  MoeLayerOptions o;
  o.router.hidden_size = 8;
  o.router.num_experts = 4;
  o.router.top_k = 2;
  o.router.capacity_factor = capacity;
  o.experts.num_experts = 4;
  o.experts.hidden_size = 8;
  o.experts.ffn_size = 16;
  o.kernel_path = KernelPath::kReference;
  return o;
}

TEST(MoeLayer, ForwardBackwardShapesAndDeterminism) {
  torch::manual_seed(3);
  MoeLayer layer(small_layer(0.0));
  auto x = torch::randn({13, 8}, torch::requires_grad());
  auto a = layer->forward(x);
  a.y.sum().backward();
  EXPECT_EQ(a.y.sizes(), x.sizes());
  EXPECT_EQ(a.tokens_per_expert.sum().item<int64_t>(), 26);
  ASSERT_TRUE(x.grad().defined());
  auto gx = x.grad().clone();
  x.mutable_grad().zero_();
  auto b = layer->forward(x);
  b.y.sum().backward();
  EXPECT_TRUE(torch::equal(a.y, b.y));
  EXPECT_TRUE(torch::equal(gx, x.grad()));
  for (auto& p : layer->parameters()) EXPECT_TRUE(p.grad().defined());
}

// moe.fused_gate_up: one gate-up GEMM (SwiGLU, GeGLU) where the weights' bf16 copies exist anyway
// (fp32 weights); bf16 weights keep two GEMMs reading them in place (a concatenated copy would be
// kept for the backward); off when asked. (The grouped path itself runs on sm_90:
// experts_gpu_test.cpp.)
TEST(Experts, OneGateUpGemmOnlyWhereTheWeightsAreCopiedToBf16Anyway) {
  ExpertsOptions o;
  o.num_experts = 2, o.hidden_size = 8, o.ffn_size = 16;
  Experts fp32(o);
  EXPECT_TRUE(fp32->fuses_gate_up());
  fp32->to(torch::kBFloat16);
  EXPECT_FALSE(fp32->fuses_gate_up());
  // GeGLU has a packed form too; clamped SwiGLU (gpt-oss, biases) and relu2 (no gate) do not.
  o.activation = config::ExpertActivation::kGeglu;
  EXPECT_TRUE(Experts(o)->fuses_gate_up());
  o.activation = config::ExpertActivation::kClampedSwiglu;
  EXPECT_FALSE(Experts(o)->fuses_gate_up());
  o.activation = config::ExpertActivation::kRelu2;
  EXPECT_FALSE(Experts(o)->fuses_gate_up());
  o.activation = config::ExpertActivation::kSwiglu;
  o.fused_gate_up = false;
  Experts off(o);
  EXPECT_FALSE(off->fuses_gate_up());
}

// The one-GEMM weights: [w_gate | w_up] in bf16 as at::cat of the two casts, gradients widened
// back; a frozen input gets none.
TEST(Experts, ConcatBf16IsTheCatOfTheCastsBothWays) {
  torch::manual_seed(8);
  const auto a = torch::randn({3, 5, 4}).requires_grad_(true);
  const auto b = torch::randn({3, 5, 6}).requires_grad_(true);
  const auto w = concat_bf16(a, b);
  EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(w, torch::cat({a.to(torch::kBFloat16), b.to(torch::kBFloat16)}, 2)));
  const auto g = torch::randn({3, 5, 10}).to(torch::kBFloat16);
  w.backward(g);
  EXPECT_TRUE(torch::equal(a.grad(), g.narrow(2, 0, 4).to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(b.grad(), g.narrow(2, 4, 6).to(torch::kFloat)));
  EXPECT_EQ(a.grad().scalar_type(), torch::kFloat);
  const auto frozen = torch::randn({3, 5, 4});
  const auto b2 = torch::randn({3, 5, 6}).requires_grad_(true);
  concat_bf16(frozen, b2).backward(g);
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_TRUE(torch::equal(b2.grad(), g.narrow(2, 4, 6).to(torch::kFloat)));
}

// moe.dispatch_dtype = compute under bf16 autocast: the same forward bit for bit (the experts
// cast the rows to bf16 either way), the input gradient within bf16 rounding of the fp32
// dispatch's (each token's k row gradients summed in bf16); without autocast nothing changes.
TEST(MoeLayer, DispatchInTheComputeDtype) {
  for (bool autocast : {true, false}) {
    SCOPED_TRACE(autocast);
    auto run = [&](bool compute) {
      torch::manual_seed(5);
      MoeLayerOptions o = small_layer(0.0);
      o.dispatch_in_compute_dtype = compute;
      MoeLayer layer(o);
      torch::manual_seed(6);
      auto x = torch::randn({64, 8}, torch::requires_grad());
      at::autocast::set_autocast_enabled(at::kCPU, autocast);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      auto out = layer->forward(x);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
      (out.y.to(torch::kFloat) * torch::linspace(-1, 1, 8)).sum().backward();
      return std::make_pair(out.y.detach(), x.grad());
    };
    const auto [y32, g32] = run(false);
    const auto [y16, g16] = run(true);
    EXPECT_TRUE(torch::equal(y16, y32)) << "the forward is the same bit for bit";
    const double rel = ((g16 - g32).abs().max() / g32.abs().max()).item<double>();
    if (autocast) {
      EXPECT_LT(rel, 1e-2) << "within bf16 rounding";
      EXPECT_GT(rel, 0.0) << "the row gradients were summed in bf16: the rows moved in bf16";
    } else {
      EXPECT_EQ(rel, 0.0) << "no autocast: no cast";
    }
  }
}

TEST(MoeLayer, CapacityDropsAreReported) {
  torch::manual_seed(4);
  MoeLayer layer(small_layer(0.5));  // capacity ceil(0.5 * 40 * 2 / 4) = 10 per expert
  auto out = layer->forward(torch::randn({40, 8}));
  EXPECT_LE(out.tokens_per_expert.max().item<int64_t>(), 10);
  EXPECT_EQ(out.dropped + out.tokens_per_expert.sum().item<int64_t>(), 80);
  EXPECT_GE(out.dropped, 40);
}

}  // namespace
}  // namespace moe::moe
