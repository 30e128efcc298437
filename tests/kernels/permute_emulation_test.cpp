// The permute family's GPU checks (permute_checks.h) run on the CPU with the kernels' emulation
// (permute_emulation.h) over the GPU tests' full grid, and mutation cases (a swapped index, an
// element off by 4 ulp, an unwritten row), each asserted to fail the check it targets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "permute_checks.h"
#include "permute_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

// ---- the full grid, emulated ----------------------------------------------------------------

class PermuteEmulation : public ::testing::TestWithParam<PermuteCase> {};
TEST_P(PermuteEmulation, PassesTheGpuChecks) {
  const PermuteInputs in = make_permute_inputs(GetParam(), kCpu);
  const auto vs = check_permute(in, emu::permute_all(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, PermuteEmulation, ::testing::ValuesIn(permute_cases()),
                         [](const auto& i) { return case_name(i.param); });
INSTANTIATE_TEST_SUITE_P(Shapes, PermuteEmulation, ::testing::ValuesIn(permute_shape_cases()),
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

// ---- mutations: each check can fail -----------------------------------------------------------

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

// Bugs a kernel edit could make, run through the kernels' own per-token bodies: each must fail
// the checks of the outputs it touches, on every launch shape it applies to.
TEST(KernelCheckMutations, RowKernelFaultsFail) {
  using emu::EmulatedFault;
  const std::vector<PermuteCase> cases = {
      {torch::kBFloat16, 33, 16, 8, 1000},  // 16-byte packs, 32 lanes, unrolled K = 8
      {torch::kHalf, 33, 16, 2, 200},       // packs, 32 lanes (25 packs), K = 2
      {torch::kFloat, 33, 16, 7, 72},       // packs, 32 lanes (18 packs), runtime k
      {torch::kBFloat16, 33, 16, 10, 3},    // one element per thread, 4 lanes, two chunks
  };
  for (const PermuteCase& c : cases) {
    SCOPED_TRACE(case_name(c));
    const PermuteInputs in = make_permute_inputs(c, kCpu);
    ASSERT_TRUE(all_ok(check_permute(in, emu::permute_all(in)), nullptr));
    // k - 1: the last assignment of each token is neither scattered, summed nor differentiated.
    {
      const auto vs =
          check_permute(in, emu::permute_all(in, EmulatedFault::kLastAssignmentSkipped));
      for (const char* name :
           {"permute", "permute_bwd", "combine", "combine_bwd_y", "combine_bwd_w"}) {
        EXPECT_FALSE(find(vs, name).ok()) << name << " passed with the last assignment skipped";
      }
    }
    // Half the lanes: the other half's packs stay unwritten (NaN) in every row output.
    {
      const auto vs = check_permute(in, emu::permute_all(in, EmulatedFault::kHalfTheLanes));
      for (const char* name : {"permute", "permute_bwd", "combine", "combine_bwd_y"}) {
        EXPECT_FALSE(find(vs, name).ok()) << name << " passed with half the lanes";
      }
    }
    // A butterfly one level short: lane 0 holds half the dot product.
    expect_fails_only(check_permute(in, emu::permute_all(in, EmulatedFault::kShortReduction)),
                      "combine_bwd_w");
  }
  // A dropped assignment's weight gradient left unwritten (NaN) instead of 0.
  const PermuteInputs in = make_permute_inputs({torch::kFloat, 33, 16, 4, 8}, kCpu);
  PermuteOutputs good = emu::permute_all(in);
  auto dropped = in.rows_of_assignment.lt(0).nonzero();
  ASSERT_GT(dropped.size(0), 0);
  good.grad_w = good.grad_w.clone();
  good.grad_w.view({-1})[dropped[0][0].item<int64_t>()] = NAN;
  expect_fails_only(check_permute(in, good), "combine_bwd_w");
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

}  // namespace
}  // namespace moe::kernel_checks
