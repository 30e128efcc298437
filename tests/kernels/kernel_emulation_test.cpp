// The GPU kernel tests' own comparisons (kernel_checks.h), run on the CPU in CI with an emulation
// of each kernel's arithmetic (kernel_emulation.h) in place of the kernel, over the GPU tests'
// full grid: the tolerances admit what the kernels compute. And mutation cases: one swapped
// index, one element off by 4 ulp, one unwritten row, each asserted to fail the check it
// targets: the checks can fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "kernel_checks.h"
#include "kernel_emulation.h"
#include "moe/kernels/kernel_args.h"
#include "moe/moe/router.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

std::string failures(const std::vector<Verdict>& vs) {
  std::string m;
  all_ok(vs, &m);
  return m;
}

// ---- the full grid, emulated ----------------------------------------------------------------

class PermuteEmulation : public ::testing::TestWithParam<PermuteCase> {};
TEST_P(PermuteEmulation, PassesTheGpuChecks) {
  const PermuteInputs in = make_permute_inputs(GetParam(), kCpu);
  const auto vs = check_permute(in, emu::permute_all(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, PermuteEmulation, ::testing::ValuesIn(permute_cases()),
                         [](const auto& i) { return case_name(i.param); });

class PlanEmulation : public ::testing::TestWithParam<PlanCase> {};
TEST_P(PlanEmulation, PassesTheGpuChecks) {
  const PlanCase c = GetParam();
  auto idx = make_plan_topk(c, kCpu);
  auto [st, sa, counts] = emu::dispatch_plan(idx, c.experts);
  const auto vs = check_plan(idx, c.experts, {st, sa, counts});
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(PlanGrid, PlanEmulation, ::testing::ValuesIn(plan_cases()),
                         [](const auto& i) { return case_name(i.param); });

class RouterEmulation : public ::testing::TestWithParam<RouterCase> {};
TEST_P(RouterEmulation, PassesTheGpuChecks) {
  const RouterInputs in = make_router_inputs(GetParam(), kCpu);
  int64_t ties = 0;
  const auto vs = check_router(in, emu::router(in), &ties);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  RecordProperty("ties", static_cast<int>(ties));
}
INSTANTIATE_TEST_SUITE_P(Grid, RouterEmulation, ::testing::ValuesIn(router_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(ExpertsEmulation, GroupedGemmPassesTheGpuChecks) {
  for (int64_t E : {1, 8, 64}) {
    for (int64_t min_count : {0, 1}) {  // 0: some experts may have no rows
      const GroupedGemmInputs in = make_grouped_gemm_inputs(E, min_count, kCpu);
      const auto vs = check_grouped_gemm(in, emu::grouped_gemm(in));
      EXPECT_TRUE(all_ok(vs, nullptr)) << "E=" << E << "\n" << failures(vs);
    }
  }
}

TEST(ExpertsEmulation, ModulePassesTheGpuChecks) {
  for (int64_t E : {1, 8}) {
    const ExpertsInputs in = make_experts_inputs(E, kCpu);
    ASSERT_TRUE(in.counts.gt(0).all().item<bool>());
    const auto vs = check_experts(in, emu::experts(in));
    EXPECT_TRUE(all_ok(vs, nullptr)) << "E=" << E << "\n" << failures(vs);
  }
}

// ---- mutations: each check can fail -----------------------------------------------------------

// Moves element `i` of `t` by `ulps` ulp of t's dtype (a copy).
torch::Tensor nudged(const torch::Tensor& t, int64_t i, double ulps) {
  auto m = t.clone();
  auto flat = m.view({-1});
  const double v = flat[i].item<double>();
  const double step = ulp(torch::tensor({v}, torch::kDouble), t.scalar_type())[0].item<double>();
  flat[i] = v + ulps * step;
  return m;
}

void expect_fails_only(const std::vector<Verdict>& vs, const std::string& name) {
  for (const auto& v : vs) {
    if (v.name == name) {
      EXPECT_FALSE(v.ok()) << name << " did not catch the mutation";
    } else {
      EXPECT_TRUE(v.ok()) << v;
    }
  }
}

TEST(KernelCheckMutations, PermuteFourUlpOffFails) {
  // fp32 with k = 2: the accumulation bound stays under 3 ulp at the tightest element.
  for (const PermuteCase& c :
       {PermuteCase{torch::kBFloat16, 4096, 64, 8}, PermuteCase{torch::kHalf, 4096, 64, 8},
        PermuteCase{torch::kFloat, 4096, 64, 2}}) {
    SCOPED_TRACE(case_name(c));
    const PermuteInputs in = make_permute_inputs(c, kCpu);
    const PermuteOutputs good = emu::permute_all(in);
    const auto base = check_permute(in, good);
    ASSERT_TRUE(all_ok(base, nullptr)) << failures(base);
    for (const char* name : {"permute_bwd", "combine", "combine_bwd_y"}) {
      const Verdict& v = find(base, name);
      ASSERT_GE(v.tightest, 0);
      ASSERT_LT(v.tightest_ulps, 3.0) << name << ": a 4-ulp error could hide in the tolerance";
      for (double dir : {4.0, -4.0}) {
        PermuteOutputs bad = good;
        torch::Tensor& target = std::string(name) == "permute_bwd" ? bad.grad_x
                                : std::string(name) == "combine"   ? bad.combined
                                                                   : bad.grad_y;
        target = nudged(target, v.tightest, dir);
        expect_fails_only(check_permute(in, bad), name);
      }
    }
  }
}

TEST(KernelCheckMutations, PermuteSwappedIndexAndUnwrittenRowFail) {
  const PermuteInputs in = make_permute_inputs({torch::kBFloat16, 4096, 64, 8}, kCpu);
  const PermuteOutputs good = emu::permute_all(in);
  ASSERT_TRUE(all_ok(check_permute(in, good), nullptr));
  // Two destination rows fed by different tokens, swapped.
  const int64_t last = in.source_token.numel() - 1;
  ASSERT_NE(in.source_token[0].item<int64_t>(), in.source_token[last].item<int64_t>());
  PermuteOutputs swapped = good;
  swapped.permuted = good.permuted.index_select(
      0, torch::arange(last + 1).index_put_({torch::tensor({int64_t{0}, last})},
                                            torch::tensor({last, int64_t{0}})));
  expect_fails_only(check_permute(in, swapped), "permute");
  PermuteOutputs rows = good;
  rows.rows_of_assignment = good.rows_of_assignment.clone();
  auto first_kept = good.rows_of_assignment.ge(0).nonzero()[0][0].item<int64_t>();
  rows.rows_of_assignment[first_kept] = -1;  // as if the inversion skipped it
  expect_fails_only(check_permute(in, rows), "rows");
  // One row never written: a poisoned (NaN) row in each float output.
  for (const char* name : {"permute", "permute_bwd", "combine", "combine_bwd_y"}) {
    PermuteOutputs bad = good;
    torch::Tensor& t = std::string(name) == "permute"       ? bad.permuted
                       : std::string(name) == "permute_bwd" ? bad.grad_x
                       : std::string(name) == "combine"     ? bad.combined
                                                            : bad.grad_y;
    t = t.clone();
    t[7].fill_(NAN);
    expect_fails_only(check_permute(in, bad), name);
  }
  PermuteOutputs gw = good;
  gw.grad_w = good.grad_w.clone();
  gw.grad_w.view({-1})[in.source_assignment[3].item<int64_t>()] = 0.f;  // a kept weight unwritten
  expect_fails_only(check_permute(in, gw), "combine_bwd_w");
}

TEST(KernelCheckMutations, PlanSwappedIndexAndUnwrittenRowFail) {
  const PlanCase c{4096, 64, 8};
  auto idx = make_plan_topk(c, kCpu);
  auto [st, sa, counts] = emu::dispatch_plan(idx, c.experts);
  ASSERT_TRUE(all_ok(check_plan(idx, c.experts, {st, sa, counts}), nullptr));
  const int64_t last = sa.numel() - 1;  // first and last rows belong to different experts
  auto swapped = sa.clone();
  swapped[0] = sa[last];
  swapped[last] = sa[0];
  expect_fails_only(check_plan(idx, c.experts, {st, swapped, counts}), "source_assignment");
  auto unwritten = st.clone();
  unwritten[100] = -1;
  expect_fails_only(check_plan(idx, c.experts, {unwritten, sa, counts}), "source_token");
  // The emulated kernel itself with an out-of-range id leaves that assignment's row unwritten
  // (instead of writing out of bounds); the checks see it.
  auto bad_idx = idx.clone();
  bad_idx[5][1] = c.experts;
  auto [st2, sa2, counts2] = emu::dispatch_plan(bad_idx, c.experts);
  EXPECT_FALSE(find(check_plan(idx, c.experts, {st2, sa2, counts2}), "source_assignment").ok());
}

TEST(KernelCheckMutations, RouterSwappedIndexAndUnwrittenRowFail) {
  for (const RouterCase& c : {RouterCase{torch::kFloat, 4096, 64, 2, false, false},
                              RouterCase{torch::kFloat, 4096, 64, 8, true, false},
                              RouterCase{torch::kFloat, 4096, 8, 2, false, true}}) {
    SCOPED_TRACE(case_name(c));
    const RouterInputs in = make_router_inputs(c, kCpu);
    const RouterOutputs good = emu::router(in);
    ASSERT_TRUE(all_ok(check_router(in, good), nullptr));
    // Token 0's last choice replaced by its lowest-scoring expert (weights and counts follow,
    // so only the selection is wrong).
    RouterOutputs swapped = good;
    swapped.topk_idx = good.topk_idx.clone();
    auto keys = in.bias.defined() ? good.probs[0] + in.bias : good.probs[0];
    const int64_t worst = keys.argmin().item<int64_t>();
    swapped.topk_idx[0][in.k - 1] = worst;
    auto p = good.probs[0].index_select(0, swapped.topk_idx[0]);
    swapped.topk_weight = good.topk_weight.clone();
    swapped.topk_weight[0] = c.k > 1 || c.sigmoid ? p / p.sum() : p;
    swapped.tokens_per_expert = torch::bincount(swapped.topk_idx.reshape(-1), {}, c.experts);
    swapped.grad_logits = torch::Tensor();  // the backward of the mutated choice is not checked
    auto vs = check_router(in, swapped);
    EXPECT_FALSE(find(vs, "selection").ok());
    EXPECT_TRUE(find(vs, "topk_weight").ok()) << find(vs, "topk_weight");
    EXPECT_TRUE(find(vs, "tokens_per_expert").ok());
    // Unwritten rows: poisoned probs, ids, gradients.
    RouterOutputs probs = good;
    probs.probs = good.probs.clone();
    probs.probs[9].fill_(NAN);
    EXPECT_FALSE(find(check_router(in, probs), "probs").ok());
    RouterOutputs ids = good;
    ids.topk_idx = good.topk_idx.clone();
    ids.topk_idx[9].fill_(-1);
    EXPECT_FALSE(find(check_router(in, ids), "selection").ok());
    RouterOutputs grads = good;
    grads.grad_logits = good.grad_logits.clone();
    grads.grad_logits[9].fill_(NAN);
    expect_fails_only(check_router(in, grads), "grad_logits");
  }
}

TEST(KernelCheckMutations, GroupedGemmAndExpertsFail) {
  const GroupedGemmInputs in = make_grouped_gemm_inputs(8, 1, kCpu);
  const GroupedGemmOutputs good = emu::grouped_gemm(in);
  const auto base = check_grouped_gemm(in, good);
  ASSERT_TRUE(all_ok(base, nullptr)) << failures(base);
  for (const char* name : {"c", "grad_a", "grad_b"}) {
    const Verdict& v = find(base, name);
    ASSERT_LT(v.tightest_ulps, 3.0) << name;
    for (double dir : {4.0, -4.0}) {
      GroupedGemmOutputs bad = good;
      torch::Tensor& t = std::string(name) == "c"        ? bad.c
                         : std::string(name) == "grad_a" ? bad.grad_a
                                                         : bad.grad_b;
      t = nudged(t, v.tightest, dir);
      expect_fails_only(check_grouped_gemm(in, bad), name);
    }
  }
  // An expert without rows whose weight gradient is garbage (pytorch/pytorch#172439's symptom).
  GroupedGemmInputs empty = make_grouped_gemm_inputs(8, 0, kCpu);
  empty.counts[3] = 0;
  empty.a = empty.a.narrow(0, 0, empty.counts.sum().item<int64_t>());
  empty.grad_c = empty.grad_c.narrow(0, 0, empty.a.size(0));
  GroupedGemmOutputs garbage = emu::grouped_gemm(empty);
  ASSERT_TRUE(all_ok(check_grouped_gemm(empty, garbage), nullptr));
  garbage.grad_b = garbage.grad_b.clone();
  garbage.grad_b[3][0][0] = 1.0f;
  EXPECT_FALSE(find(check_grouped_gemm(empty, garbage), "grad_b_empty").ok());

  const ExpertsInputs ein = make_experts_inputs(4, kCpu);
  const ExpertsOutputs eout = emu::experts(ein);
  ASSERT_TRUE(all_ok(check_experts(ein, eout), nullptr));
  ExpertsOutputs row = eout;
  row.y = eout.y.clone();
  row.y[11].zero_();  // a row never written (fresh zeros)
  expect_fails_only(check_experts(ein, row), "y");
  ExpertsOutputs wd = eout;
  wd.grad_w_down = eout.grad_w_down.clone();
  wd.grad_w_down[2].zero_();  // one expert's weight gradient missing
  expect_fails_only(check_experts(ein, wd), "grad_w_down");
}

// ---- rules the kernel and the reference share ---------------------------------------------------

// Exact ties go to the lower expert id; NaN scores rank lowest (a diverging step); the fused
// kernel's emulation and moe::score_and_select_reference agree on both.
TEST(RouterRules, TiesAndNanRankTheSameInKernelAndReference) {
  auto logits = torch::zeros({4, 8});
  logits[1] = torch::tensor({0.f, 1.f, 1.f, 0.f, 1.f, 0.f, 0.f, 0.f});
  logits[2] = torch::full({8}, NAN);
  logits[3] = torch::tensor({0.5f, NAN, 2.f, NAN, 2.f, -1.f, 0.f, 0.f});
  for (bool sigmoid : {false, true}) {
    RouterInputs in;
    in.k = 3;
    in.sigmoid = sigmoid;
    in.logits = logits;
    const RouterOutputs got = emu::router(in);
    auto ref = moe::score_and_select_reference(logits, {}, 3, sigmoid, true);
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

// Host-side argument checks (the same code runs before the CUDA launches when checks are on).
TEST(KernelArgs, OutOfRangeValuesAndGridLimitsAreNamed) {
  auto ids = torch::tensor({0, 3, -1, 2}, torch::kLong);
  try {
    kernels::check_values_in_range(ids, 0, 3, "topk_idx (expert ids)");
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("topk_idx (expert ids) holds 3 at position 1 of 4; expected values in [0, 3)"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(kernels::check_values_in_range(ids, -1, 4, "rows"));
  EXPECT_NO_THROW(kernels::check_values_in_range(torch::empty({0}, torch::kLong), 0, 1, "none"));
  try {
    kernels::check_grid(int64_t{1} << 31, int64_t{1} << 40, "permute_backward");
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("permute_backward over 1099511627776 items needs 2147483648 blocks"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(kernels::check_grid(std::numeric_limits<int32_t>::max(), 1, "ok"));
  const bool was = kernels::argument_checks();
  kernels::set_argument_checks(!was);
  EXPECT_EQ(kernels::argument_checks(), !was);
  kernels::set_argument_checks(was);
}

}  // namespace
}  // namespace moe::kernel_checks
