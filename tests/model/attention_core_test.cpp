// The two implementations of attention_core.h agree: the eager ATen reference (transformers'
// eager attention, with sinks) and the SDPA path (sinks as an extra key, windows as a mask), in
// values and in the gradients of q, k, v and the sinks; and each mask means what it says.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/model/attention_core.h"

namespace moe::model {
namespace {

struct Case {
  bool sinks;
  int64_t window;
  bool documents;
};

class AttentionCoreTest : public ::testing::TestWithParam<Case> {};

torch::Tensor documents_mask(int64_t B, int64_t S) {
  // Batch row 0: one document; row 1: documents of 5, 9 and the rest.
  auto doc = torch::zeros({B, S}, torch::kLong);
  doc[1].narrow(0, 5, S - 5).fill_(1);
  doc[1].narrow(0, 14, S - 14).fill_(2);
  const auto causal = torch::ones({S, S}, torch::kBool).tril();
  return (doc.unsqueeze(2).eq(doc.unsqueeze(1)) & causal).unsqueeze(1);
}

TEST_P(AttentionCoreTest, ReferenceAndSdpaAgreeInValuesAndGradients) {
  const Case c = GetParam();
  torch::manual_seed(5);
  const int64_t B = 2, H = 4, S = 24, hd = 16;
  auto q = torch::randn({B, H, S, hd}, torch::kDouble).requires_grad_();
  auto k = torch::randn({B, H, S, hd}, torch::kDouble).requires_grad_();
  auto v = torch::randn({B, H, S, hd}, torch::kDouble).requires_grad_();
  auto sinks = (torch::randn({H}, torch::kDouble) * 2).requires_grad_();
  AttentionMasking m{c.documents ? documents_mask(B, S) : torch::Tensor(), c.window,
                     c.sinks ? sinks : torch::Tensor()};
  const auto weights = torch::randn({B, H, S, hd}, torch::kDouble);
  auto run = [&](bool sdpa) {
    const auto y = sdpa ? attention_sdpa(q, k, v, m, 0.0) : attention_reference(q, k, v, m, 0.0);
    std::vector<torch::Tensor> inputs{q, k, v};
    if (c.sinks) inputs.push_back(sinks);
    auto grads = torch::autograd::grad({(y * weights).sum()}, inputs);
    grads.insert(grads.begin(), y.detach());
    return grads;
  };
  const auto ref = run(false), fast = run(true);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ref[i], fast[i], 1e-10, 1e-12))
        << "output/grad " << i << " max diff " << (ref[i] - fast[i]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionCoreTest,
                         ::testing::Values(Case{false, 0, false}, Case{false, 6, false},
                                           Case{false, 6, true}, Case{true, 0, false},
                                           Case{true, 6, false}, Case{true, 0, true},
                                           Case{true, 6, true}, Case{true, 1, false}));

// Written out by hand for one query: softmax over the keys it may see plus the sink's logit.
TEST(AttentionCore, SinkAndWindowMeanWhatTheySay) {
  torch::manual_seed(3);
  const int64_t S = 10, hd = 8, window = 3;
  auto q = torch::randn({1, 1, S, hd}, torch::kDouble),
       k = torch::randn({1, 1, S, hd}, torch::kDouble),
       v = torch::randn({1, 1, S, hd}, torch::kDouble);
  const auto sink = torch::tensor({0.7}, torch::kDouble);
  const auto y = attention_reference(q, k, v, {torch::Tensor(), window, sink}, 0.0);
  const int64_t t = 7;  // sees keys 5, 6, 7
  const double scale = 1.0 / std::sqrt(double(hd));
  double denominator = std::exp(0.7);
  auto numerator = torch::zeros({hd}, torch::kDouble);
  for (int64_t j = t - window + 1; j <= t; ++j) {
    const double e = std::exp((q[0][0][t] * k[0][0][j]).sum().item<double>() * scale);
    denominator += e;
    numerator += e * v[0][0][j];
  }
  EXPECT_TRUE(torch::allclose(y[0][0][t], numerator / denominator, 1e-12, 1e-12));
  // Without the sink the weights sum to 1; with it, less.
  const auto plain = attention_reference(q, k, v, {torch::Tensor(), window, torch::Tensor()}, 0.0);
  EXPECT_FALSE(torch::allclose(plain, y));
}

TEST(AttentionCore, MaskIsCausalWithinTheWindow) {
  const auto mask = attention_mask(6, {torch::Tensor(), 2, torch::Tensor()}, torch::kCPU);
  const auto expected = torch::tensor({{1, 0, 0, 0, 0, 0},
                                       {1, 1, 0, 0, 0, 0},
                                       {0, 1, 1, 0, 0, 0},
                                       {0, 0, 1, 1, 0, 0},
                                       {0, 0, 0, 1, 1, 0},
                                       {0, 0, 0, 0, 1, 1}})
                            .to(torch::kBool);
  EXPECT_TRUE(torch::equal(mask, expected));
  EXPECT_FALSE(attention_mask(6, {}, torch::kCPU).defined()) << "plain causal needs no mask";
}

}  // namespace
}  // namespace moe::model
