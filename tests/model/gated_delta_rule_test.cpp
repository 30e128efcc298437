// The gated delta rule's two ATen forms against each other (forward, final state and every
// input's gradient, fp32, lengths that are and are not multiples of the 64-token chunk), and
// packing: a window of three documents equals the three documents run alone, through the rule,
// the causal conv and the whole Gated DeltaNet mixer (outputs and parameter gradients).
// transformers' torch_chunk_gated_delta_rule is the oracle of tests/hf/qwen3_next_test.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/model/gated_delta_rule.h"
#include "moe/model/gated_deltanet.h"

namespace moe::model {
namespace {

constexpr double kTol = 1e-5;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

struct Leaves {
  torch::Tensor q, k, v, a, b;  // g and beta from a and b, as the mixer makes them
};
Leaves random_leaves(int64_t B, int64_t S, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv) {
  torch::manual_seed(3);
  auto leaf = [](torch::Tensor t) { return t.requires_grad_(true); };
  return {leaf(torch::randn({B, S, Hk, dk})), leaf(torch::randn({B, S, Hk, dk})),
          leaf(torch::randn({B, S, Hv, dv})), leaf(torch::randn({B, S, Hv})),
          leaf(torch::randn({B, S, Hv}))};
}
DeltaRuleInputs inputs(const Leaves& l, const torch::Tensor& positions = {}) {
  DeltaRuleInputs in{
      l.q, l.k, l.v, -torch::nn::functional::softplus(l.a) * 0.5, torch::sigmoid(l.b), positions};
  return in;
}
std::vector<torch::Tensor> gradients(const torch::Tensor& o, const Leaves& l,
                                     const torch::Tensor& weight) {
  return torch::autograd::grad({(o * weight).sum()}, {l.q, l.k, l.v, l.a, l.b});
}

class ChunkedVsRecurrent : public ::testing::TestWithParam<int64_t> {};

TEST_P(ChunkedVsRecurrent, ForwardStateAndGradients) {
  const int64_t S = GetParam();
  const auto l = random_leaves(2, S, 2, 4, 16, 8);
  const auto chunked = chunk_gated_delta_rule(inputs(l));
  const auto recurrent = recurrent_gated_delta_rule(inputs(l));
  EXPECT_LE(max_diff(chunked.o, recurrent.o), kTol);
  EXPECT_LE(max_diff(chunked.final_state, recurrent.final_state), kTol);
  const auto w = torch::randn_like(chunked.o);
  const auto gc = gradients(chunked.o, l, w), gr = gradients(recurrent.o, l, w);
  const char* names[] = {"q", "k", "v", "a", "b"};
  for (size_t i = 0; i < gc.size(); ++i) {
    EXPECT_LE(max_diff(gc[i], gr[i]), kTol) << "d/d" << names[i] << " at S = " << S;
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, ChunkedVsRecurrent, ::testing::Values(1, 50, 64, 130));

// Three documents in one window of 131 tokens (one crosses a chunk boundary, one ends inside a
// chunk), positions restarting at each.
const std::vector<int64_t> kDocs = {20, 70, 41};
torch::Tensor packed_positions() {
  std::vector<torch::Tensor> parts;
  for (int64_t n : kDocs) parts.push_back(torch::arange(n, torch::kLong));
  return torch::cat(parts).unsqueeze(0);
}

TEST(GatedDeltaRulePacking, ThreeDocumentsEqualTheirRunsAlone) {
  const auto l = random_leaves(1, 131, 2, 4, 16, 8);
  const auto w = torch::randn({1, 131, 4, 8});
  const auto packed = chunk_gated_delta_rule(inputs(l, packed_positions())).o;
  const auto g_packed = gradients(packed, l, w);
  // Each document alone, the gradients summed over the three runs (each touches its rows only).
  std::vector<torch::Tensor> alone;
  std::vector<torch::Tensor> g_alone(5);
  int64_t start = 0;
  for (int64_t n : kDocs) {
    Leaves part{l.q.narrow(1, start, n), l.k.narrow(1, start, n), l.v.narrow(1, start, n),
                l.a.narrow(1, start, n), l.b.narrow(1, start, n)};
    const auto o = chunk_gated_delta_rule(inputs(part)).o;
    alone.push_back(o);
    const auto g = gradients(o, l, w.narrow(1, start, n));  // full-size, zero off its rows
    for (size_t i = 0; i < g.size(); ++i)
      g_alone[i] = g_alone[i].defined() ? g_alone[i] + g[i] : g[i];
    start += n;
  }
  EXPECT_LE(max_diff(packed, torch::cat(alone, 1)), kTol);
  for (size_t i = 0; i < g_packed.size(); ++i) EXPECT_LE(max_diff(g_packed[i], g_alone[i]), kTol);
  // Without the documents the window is one sequence: the later documents see the earlier.
  const auto mixed = chunk_gated_delta_rule(inputs(l)).o;
  EXPECT_GT(max_diff(mixed, torch::cat(alone, 1)), 1e-3);
  // The recurrent form resets at the same places.
  EXPECT_LE(max_diff(recurrent_gated_delta_rule(inputs(l, packed_positions())).o, packed), kTol);
}

TEST(CausalConv1d, MatchesConv1dAndResetsAtDocuments) {
  torch::manual_seed(5);
  const auto x = torch::randn({2, 37, 6});
  const auto w = torch::randn({6, 1, 4});
  // nn.Conv1d with padding K - 1, cut to the first S outputs, then SiLU: transformers' form.
  const auto conv = torch::conv1d(x.transpose(1, 2), w, {}, 1, 3, 1, 6).narrow(2, 0, 37);
  EXPECT_LE(max_diff(causal_conv1d_silu(x, w), torch::silu(conv).transpose(1, 2)), 1e-6);
  // Two documents: the second's first taps read zeros, as if it started the window.
  const auto positions =
      torch::cat({torch::arange(15, torch::kLong), torch::arange(22, torch::kLong)})
          .expand({2, 37});
  const auto packed = causal_conv1d_silu(x, w, positions);
  EXPECT_LE(max_diff(packed.narrow(1, 15, 22), causal_conv1d_silu(x.narrow(1, 15, 22), w)), 1e-6);
  EXPECT_LE(max_diff(packed.narrow(1, 0, 15), causal_conv1d_silu(x.narrow(1, 0, 15), w)), 1e-6);
}

class MixerPacking : public ::testing::TestWithParam<bool> {};

TEST_P(MixerPacking, PackedWindowEqualsDocumentsAlone) {
  torch::manual_seed(9);
  GatedDeltaNetOptions o;
  o.hidden = 32, o.key_heads = 2, o.value_heads = 4, o.key_head_dim = 8, o.value_head_dim = 8;
  o.fused_projections = GetParam();
  GatedDeltaNet net(o);
  const auto x = torch::randn({1, 131, 32});
  const auto w = torch::randn({1, 131, 32});
  net->set_documents(packed_positions());
  const auto packed = net->forward(x);
  (packed * w).sum().backward();
  std::vector<torch::Tensor> g_packed;
  for (const auto& p : net->parameters())
    g_packed.push_back(p.grad().clone()), p.mutable_grad().zero_();
  net->set_documents({});
  std::vector<torch::Tensor> alone;
  int64_t start = 0;
  for (int64_t n : kDocs) {
    const auto y = net->forward(x.narrow(1, start, n));
    (y * w.narrow(1, start, n)).sum().backward();  // gradients add up over the three runs
    alone.push_back(y);
    start += n;
  }
  EXPECT_LE(max_diff(packed, torch::cat(alone, 1)), kTol);
  const auto params = net->named_parameters();
  for (size_t i = 0; i < g_packed.size(); ++i) {
    EXPECT_LE(max_diff(g_packed[i], params[i].value().grad()), 1e-4) << params[i].key();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MixerPacking, ::testing::Values(false, true));

}  // namespace
}  // namespace moe::model
