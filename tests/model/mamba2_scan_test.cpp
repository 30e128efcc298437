// The Mamba-2 scan's two ATen forms against each other (forward, final state and every input's
// gradient, fp32, lengths that are and are not multiples of the chunk, grouped B and C), and
// packing: a window of three documents equals the three documents run alone, through the scan
// and the whole Mamba-2 mixer with its conv (outputs and parameter gradients). transformers'
// torch path (mamba2_chunk_scan) is the oracle of tests/hf/nemotron_h_test.py.
#include <algorithm>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/model/mamba2_mixer.h"
#include "moe/model/mamba2_scan.h"

namespace moe::model {
namespace {

constexpr double kTol = 1e-5;

// |a - b| relative to b's scale (at least 1): the random inputs below give outputs and gradients
// of some hundreds, whose fp32 spacing alone is 1.5e-5.
double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto bd = b.to(torch::kDouble);
  const double scale = std::max(1.0, bd.abs().max().item<double>());
  return (a.to(torch::kDouble) - bd).abs().max().item<double>() / scale;
}

struct Leaves {
  torch::Tensor x, dt_raw, A_log, B, C, D;
};
Leaves random_leaves(int64_t Bn, int64_t S, int64_t H, int64_t P, int64_t G, int64_t N) {
  torch::manual_seed(4);
  auto leaf = [](torch::Tensor t) { return t.requires_grad_(true); };
  return {leaf(torch::randn({Bn, S, H, P})), leaf(torch::randn({Bn, S, H})),
          leaf(torch::rand({H}) * 2),        leaf(torch::randn({Bn, S, G, N})),
          leaf(torch::randn({Bn, S, G, N})), leaf(torch::randn({H}))};
}
SsdInputs inputs(const Leaves& l, const torch::Tensor& positions = {}) {
  SsdInputs in;
  in.x = l.x;
  in.dt = torch::nn::functional::softplus(l.dt_raw);
  in.A = -l.A_log.exp();
  in.B = l.B;
  in.C = l.C;
  in.D = l.D;
  in.positions = positions;
  return in;
}
std::vector<torch::Tensor> gradients(const torch::Tensor& y, const Leaves& l,
                                     const torch::Tensor& weight) {
  return torch::autograd::grad({(y * weight).sum()}, {l.x, l.dt_raw, l.A_log, l.B, l.C, l.D}, {},
                               /*retain_graph=*/true);
}

class SsdChunkedVsRecurrent : public ::testing::TestWithParam<int64_t> {};

TEST_P(SsdChunkedVsRecurrent, ForwardStateAndGradients) {
  const int64_t S = GetParam();
  const auto l = random_leaves(2, S, 4, 8, 2, 6);  // 2 heads per group
  const auto chunked = chunk_ssd_scan(inputs(l), 16);
  const auto recurrent = recurrent_ssd_scan(inputs(l));
  EXPECT_LE(max_diff(chunked.y, recurrent.y), kTol);
  EXPECT_LE(max_diff(chunked.final_state, recurrent.final_state), kTol);
  const auto w = torch::randn_like(chunked.y);
  const auto gc = gradients(chunked.y, l, w), gr = gradients(recurrent.y, l, w);
  const char* names[] = {"x", "dt", "A_log", "B", "C", "D"};
  for (size_t i = 0; i < gc.size(); ++i) {
    EXPECT_LE(max_diff(gc[i], gr[i]), kTol) << "d/d" << names[i] << " at S = " << S;
  }
  // The chunk is a schedule, not a result: another chunk size computes the same.
  EXPECT_LE(max_diff(chunk_ssd_scan(inputs(l), 7).y, chunked.y), kTol);
}

INSTANTIATE_TEST_SUITE_P(Lengths, SsdChunkedVsRecurrent, ::testing::Values(1, 15, 16, 50));

TEST(SsdScan, ContinuesFromAState) {
  // Two halves, the second from the first's final state, equal the whole.
  const auto l = random_leaves(1, 40, 4, 8, 1, 6);
  const auto whole = recurrent_ssd_scan(inputs(l));
  const auto half = [&](int64_t start, int64_t n) {
    Leaves p{l.x.narrow(1, start, n), l.dt_raw.narrow(1, start, n), l.A_log,
             l.B.narrow(1, start, n), l.C.narrow(1, start, n),      l.D};
    return p;
  };
  const auto first = chunk_ssd_scan(inputs(half(0, 25)), 8);
  const auto second = recurrent_ssd_scan(inputs(half(25, 15)), first.final_state);
  EXPECT_LE(max_diff(torch::cat({first.y, second.y}, 1), whole.y), kTol);
  EXPECT_LE(max_diff(second.final_state, whole.final_state), kTol);
}

// Three documents in one window of 61 tokens (chunks of 16: one document crosses two chunk
// boundaries, one ends inside a chunk), positions restarting at each.
const std::vector<int64_t> kDocs = {10, 35, 16};
torch::Tensor packed_positions() {
  std::vector<torch::Tensor> parts;
  for (int64_t n : kDocs) parts.push_back(torch::arange(n, torch::kLong));
  return torch::cat(parts).unsqueeze(0);
}

// In float64 (the scan computes in the inputs' precision when they are fp64), so that the
// shared leaves' gradients (A_log, D: sums over every token of terms of both signs) are compared
// without fp32's summation-order noise.
TEST(SsdPacking, ThreeDocumentsEqualTheirRunsAlone) {
  auto l = random_leaves(1, 61, 4, 8, 2, 6);
  for (auto* t : {&l.x, &l.dt_raw, &l.A_log, &l.B, &l.C, &l.D}) {
    *t = t->detach().to(torch::kDouble).requires_grad_(true);
  }
  const auto w = torch::randn({1, 61, 4, 8}, torch::kDouble);
  const auto packed = chunk_ssd_scan(inputs(l, packed_positions()), 16).y;
  const auto g_packed = gradients(packed, l, w);
  std::vector<torch::Tensor> alone;
  std::vector<torch::Tensor> g_alone(6);
  int64_t start = 0;
  for (int64_t n : kDocs) {
    Leaves part{l.x.narrow(1, start, n), l.dt_raw.narrow(1, start, n), l.A_log,
                l.B.narrow(1, start, n), l.C.narrow(1, start, n),      l.D};
    const auto y = chunk_ssd_scan(inputs(part), 16).y;
    alone.push_back(y);
    const auto g = gradients(y, l, w.narrow(1, start, n));  // full-size leaves' gradients
    for (size_t i = 0; i < g.size(); ++i)
      g_alone[i] = g_alone[i].defined() ? g_alone[i] + g[i] : g[i];
    start += n;
  }
  EXPECT_LE(max_diff(packed, torch::cat(alone, 1)), 1e-12);
  const char* names[] = {"x", "dt", "A_log", "B", "C", "D"};
  for (size_t i = 0; i < g_packed.size(); ++i) {
    EXPECT_LE(max_diff(g_packed[i], g_alone[i]), 1e-12) << "d/d" << names[i];
  }
  // Without the documents the window is one sequence: the later documents see the earlier.
  EXPECT_GT(max_diff(chunk_ssd_scan(inputs(l), 16).y, torch::cat(alone, 1)), 1e-3);
  // The recurrent form resets at the same places.
  EXPECT_LE(max_diff(recurrent_ssd_scan(inputs(l, packed_positions())).y, packed), kTol);
}

TEST(Mamba2Mixer, PackedWindowEqualsDocumentsAlone) {
  torch::manual_seed(9);
  Mamba2Options o;
  o.hidden = 32, o.heads = 4, o.head_dim = 8, o.state_size = 6, o.groups = 2, o.chunk = 16;
  Mamba2Mixer net(o);
  const auto x = torch::randn({1, 61, 32});
  const auto w = torch::randn({1, 61, 32});
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
  // The conv's bias makes a document's first outputs differ from a run of the whole window.
  EXPECT_GT(max_diff(net->forward(x), packed), 1e-4);
}

TEST(Mamba2Mixer, GroupGatedNormNormalisesEachGroup) {
  torch::manual_seed(2);
  const auto x = torch::randn({3, 12}), z = torch::randn({3, 12});
  const auto w = torch::rand({12});
  const auto y = group_gated_rms_norm(x, z, w, 3, 1e-6);
  const auto g = (x * torch::silu(z)).view({3, 3, 4});
  const auto want = (g / (g.pow(2).mean(-1, true) + 1e-6).sqrt()).view({3, 12}) * w;
  EXPECT_LE(max_diff(y, want), 1e-6);
}

}  // namespace
}  // namespace moe::model
