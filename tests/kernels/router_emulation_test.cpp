// The router family's GPU checks (router_checks.h) run on the CPU with score_and_select's
// emulation (router_emulation.h) over the GPU tests' full grid; mutation cases that must fail;
// and the tie and NaN rules the kernel shares with the reference moe::score_and_select.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/moe/router.h"
#include "router_checks.h"
#include "router_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

// ---- the full grid, emulated ----------------------------------------------------------------

class RouterEmulation : public ::testing::TestWithParam<RouterCase> {};
TEST_P(RouterEmulation, PassesTheGpuChecks) {
  const ScoreAndSelectInputs in = make_score_and_select_inputs(GetParam(), kCpu);
  int64_t ties = 0;
  const auto vs = check_score_and_select(in, emu::score_and_select(in), &ties);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  RecordProperty("ties", static_cast<int>(ties));
}
INSTANTIATE_TEST_SUITE_P(Grid, RouterEmulation, ::testing::ValuesIn(router_cases()),
                         [](const auto& i) { return case_name(i.param); });

// ---- mutations: each check can fail -----------------------------------------------------------

TEST(KernelCheckMutations, RouterSwappedIndexAndUnwrittenRowFail) {
  for (const RouterCase& c : {RouterCase{torch::kFloat, 4096, 64, 2, false, false},
                              RouterCase{torch::kFloat, 4096, 64, 8, true, false},
                              RouterCase{torch::kFloat, 4096, 8, 2, false, true}}) {
    SCOPED_TRACE(case_name(c));
    const ScoreAndSelectInputs in = make_score_and_select_inputs(c, kCpu);
    const ScoreAndSelectOutputs good = emu::score_and_select(in);
    ASSERT_TRUE(all_ok(check_score_and_select(in, good), nullptr));
    // Token 0's last choice replaced by its lowest-scoring expert (weights and counts follow,
    // so only the selection is wrong).
    ScoreAndSelectOutputs swapped = good;
    swapped.topk_idx = good.topk_idx.clone();
    auto keys = in.bias.defined() ? good.probs[0] + in.bias : good.probs[0];
    const int64_t worst = keys.argmin().item<int64_t>();
    swapped.topk_idx[0][in.k - 1] = worst;
    auto p = good.probs[0].index_select(0, swapped.topk_idx[0]);
    swapped.topk_weight = good.topk_weight.clone();
    swapped.topk_weight[0] = c.k > 1 || c.sigmoid ? p / p.sum() : p;
    swapped.tokens_per_expert = torch::bincount(swapped.topk_idx.reshape(-1), {}, c.experts);
    swapped.grad_logits = torch::Tensor();  // the backward of the mutated choice is not checked
    auto vs = check_score_and_select(in, swapped);
    EXPECT_FALSE(find(vs, "selection").ok());
    EXPECT_TRUE(find(vs, "topk_weight").ok()) << find(vs, "topk_weight");
    EXPECT_TRUE(find(vs, "tokens_per_expert").ok());
    // Unwritten rows: poisoned probs, ids, gradients.
    ScoreAndSelectOutputs probs = good;
    probs.probs = good.probs.clone();
    probs.probs[9].fill_(NAN);
    EXPECT_FALSE(find(check_score_and_select(in, probs), "probs").ok());
    ScoreAndSelectOutputs ids = good;
    ids.topk_idx = good.topk_idx.clone();
    ids.topk_idx[9].fill_(-1);
    EXPECT_FALSE(find(check_score_and_select(in, ids), "selection").ok());
    ScoreAndSelectOutputs grads = good;
    grads.grad_logits = good.grad_logits.clone();
    grads.grad_logits[9].fill_(NAN);
    expect_fails_only(check_score_and_select(in, grads), "grad_logits");
  }
}

// ---- rules the kernel and the reference share ---------------------------------------------------

// Exact ties go to the lower expert id; NaN scores rank lowest (a diverging step); the fused
// kernel's emulation and moe::score_and_select agree on both.
TEST(RouterRules, TiesAndNanRankTheSameInKernelAndReference) {
  auto logits = torch::zeros({4, 8});
  logits[1] = torch::tensor({0.f, 1.f, 1.f, 0.f, 1.f, 0.f, 0.f, 0.f});
  logits[2] = torch::full({8}, NAN);
  logits[3] = torch::tensor({0.5f, NAN, 2.f, NAN, 2.f, -1.f, 0.f, 0.f});
  for (bool sigmoid : {false, true}) {
    ScoreAndSelectInputs in;
    in.k = 3;
    in.sigmoid = sigmoid;
    in.logits = logits;
    const ScoreAndSelectOutputs got = emu::score_and_select(in);
    auto ref = moe::score_and_select(logits, {}, 3, sigmoid, true);
    EXPECT_TRUE(torch::equal(got.topk_idx, ref.topk_idx))
        << (sigmoid ? "sigmoid" : "softmax") << "\n"
        << got.topk_idx << "\n"
        << ref.topk_idx;
    EXPECT_TRUE(torch::equal(got.topk_idx[0], torch::tensor({0, 1, 2})));
    EXPECT_TRUE(torch::equal(got.topk_idx[1], torch::tensor({1, 2, 4})));
    EXPECT_TRUE(torch::equal(got.topk_idx[2], torch::tensor({0, 1, 2})));  // all NaN
    EXPECT_TRUE(got.topk_idx.ge(0).all().item<bool>());
  }
}

}  // namespace
}  // namespace moe::kernel_checks
