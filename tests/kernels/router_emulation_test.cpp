// The router family's GPU checks (router_checks.h) run on the CPU with score_and_select's
// emulation (router_emulation.h) over the GPU tests' full grid; mutation cases that must fail;
// and the tie and NaN rules the kernel shares with the reference moe::score_and_select, expert
// groups included (DeepSeek-V3 / GLM-4.5 / DeepSeek-V2's group-limited selection).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

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

// Group-limited selection: a wrong tie rule or a wrong group key each changes some token's
// choice on the group cases where it matters, and both comparisons catch it.
TEST(KernelCheckMutations, RouterGroupTieRulesAndGroupKeysFail) {
  auto group_case = [](const std::string& name) {
    for (const RouterGroupCase& c : router_group_cases()) {
      if (c.name == name) return c;
    }
    ADD_FAILURE() << "no group case " << name;
    return router_group_cases().front();
  };
  struct Mutated {
    const char* what;
    emu::RouterMutation m;
    const char* on;
  };
  const std::vector<Mutated> mutations = {
      {"group ties to the higher id", {.group_ties_to_higher_id = true}, "deepseek_v3_coarse"},
      {"group ties to the higher id", {.group_ties_to_higher_id = true}, "e72_groups9"},
      {"expert ties to the higher id", {.expert_ties_to_higher_id = true}, "deepseek_v3_coarse"},
      {"group key: the best only", {.group_key_best_only = true}, "deepseek_v3"},
      {"group key: the best twice", {.group_key_best_twice = true}, "deepseek_v3"},
      {"group key: the best twice", {.group_key_best_twice = true}, "tiny_sigmoid_coarse"},
      {"NaN group keys last", {.nan_group_keys_last = true}, "inf_bias"},
  };
  for (const Mutated& mu : mutations) {
    const RouterGroupCase c = group_case(mu.on);
    SCOPED_TRACE(std::string(mu.what) + " on " + c.name);
    const ScoreAndSelectInputs in = make_score_and_select_inputs(c, kCpu);
    const ScoreAndSelectOutputs good = emu::score_and_select(in);
    ASSERT_TRUE(all_ok(check_against_reference(in, good), nullptr));
    ASSERT_TRUE(all_ok(check_score_and_select(in, good), nullptr));
    ScoreAndSelectOutputs bad = emu::score_and_select(in, mu.m);
    const int64_t moved = (bad.topk_idx != good.topk_idx).any(1).sum().item<int64_t>();
    EXPECT_GT(moved, 0) << "the mutation changes no token's choice";
    EXPECT_FALSE(find(check_against_reference(in, bad), "reference_ids").ok());
    bad.grad_logits = torch::Tensor();  // the backward of the mutated choice is not checked
    const auto vs = check_score_and_select(in, bad);
    EXPECT_FALSE(find(vs, "selection").ok());
    EXPECT_TRUE(find(vs, "probs").ok());
    RecordProperty(std::string(mu.what) + " on " + c.name + ": moved", static_cast<int>(moved));
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

// Group-limited selection over router_group_cases() (the models' shapes and the edges): the
// emulated kernel's choice on the reference's own scores is the reference's, bit for bit (ids,
// weights, counts); and the whole emulated kernel passes the GPU checks (scores and gradients
// within their tolerances where the inputs are finite; its choice, weights and counts bitwise
// the reference's on its own scores). Every case in one test (one ctest entry, RouterRules).
TEST(RouterRules, GroupLimitedSelectionIsTheReferences) {
  for (const RouterGroupCase& c : router_group_cases()) {
    SCOPED_TRACE(c.name);
    const ScoreAndSelectInputs in = make_score_and_select_inputs(c, kCpu);
    const auto ref = moe::score_and_select(in.logits, in.bias, in.k, in.sigmoid, in.normalize,
                                           in.n_group, in.topk_group, in.group_score_experts);
    const auto [ids, weights] = emu::select_experts(ref.probs, in);
    EXPECT_TRUE(torch::equal(ids, ref.topk_idx));
    ScoreAndSelectOutputs on_ref{
        ref.probs, ids, weights, ref.lse, torch::bincount(ids.reshape(-1), {}, in.logits.size(1)),
        {}};
    EXPECT_TRUE(torch::equal(on_ref.tokens_per_expert, ref.tokens_per_expert));
    auto vs = check_against_reference(in, on_ref);
    EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
    // The whole emulated kernel.
    const ScoreAndSelectOutputs out = emu::score_and_select(in);
    vs = check_against_reference(in, out);
    EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
    if (finite_inputs(c)) {
      int64_t ties = 0;
      vs = check_score_and_select(in, out, &ties);
      EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
      EXPECT_EQ(ties, 0);
    }
    // The kernel's choice from its own scores vs the reference's from ATen's: they differ only
    // where the two round a score apart (reported, not a failure).
    RecordProperty(c.name + "_moved_by_rounding",
                   static_cast<int>((out.topk_idx != ref.topk_idx).any(1).sum().item<int64_t>()));
  }
}

// Hand-made tokens with known answers (sigmoid scores; 8 experts in 4 groups of 2; top-2):
//   row 0: all logits equal: every group ties, the lowest groups and ids win: 0, 1
//   row 1: groups 1 and 2 tie for the best, one kept: group 1 (experts 2, 3)
//   row 2: all NaN: every key -inf, every group key -inf: 0, 1
//   row 3: group 0 = {s(3), s(-3)} sums to 1.0 < group 1's 2 s(1) = 1.46 but has the best
//          expert: summed (2 experts) group 1 wins, keyed by its best (1 expert) group 0
//   row 4: a NaN (-inf) key in groups 0-2, next to the best experts: summed, those groups
//          are -inf and group 3 wins; keyed by their best, groups 0-2 tie and group 0 wins
TEST(RouterRules, GroupTiesAndNanRankTheSameInKernelAndReference) {
  auto logits = torch::tensor({{0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f},
                               {0.f, 0.f, 1.f, 1.f, 1.f, 1.f, 0.f, 0.f},
                               {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN},
                               {3.f, -3.f, 1.f, 1.f, -9.f, -9.f, -9.f, -9.f},
                               {5.f, NAN, 5.f, NAN, NAN, 5.f, -1.f, -2.f}});
  for (int64_t scored : {2, 1}) {
    SCOPED_TRACE("group_score_experts " + std::to_string(scored));
    ScoreAndSelectInputs in;
    in.k = 2;
    in.sigmoid = true;
    in.logits = logits;
    in.n_group = 4;
    in.topk_group = 1;
    in.group_score_experts = scored;
    const ScoreAndSelectOutputs got = emu::score_and_select(in);
    const auto ref = moe::score_and_select(logits, {}, 2, true, true, 4, 1, scored);
    EXPECT_TRUE(torch::equal(got.topk_idx, ref.topk_idx)) << got.topk_idx << "\n" << ref.topk_idx;
    EXPECT_TRUE(torch::equal(got.topk_idx[0], torch::tensor({0, 1})));
    EXPECT_TRUE(torch::equal(got.topk_idx[1], torch::tensor({2, 3})));
    EXPECT_TRUE(torch::equal(got.topk_idx[2], torch::tensor({0, 1})));
    EXPECT_TRUE(
        torch::equal(got.topk_idx[3], scored == 2 ? torch::tensor({2, 3}) : torch::tensor({0, 1})));
    EXPECT_TRUE(
        torch::equal(got.topk_idx[4], scored == 2 ? torch::tensor({6, 7}) : torch::tensor({0, 1})));
  }
}

}  // namespace
}  // namespace moe::kernel_checks
