// The permute family's CUDA kernels (dispatch_plan, permute, combine) against their
// double-precision oracles (label `gpu`; skipped without a device).
//
// The comparisons and their tolerances live in permute_checks.cpp and are exercised on the CPU,
// with an emulation of these kernels, by permute_emulation_test.cpp. Every launch here poisons
// its outputs first (NaN / -1), so an element a kernel never writes fails its check.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "moe/kernels/kernel_args.h"
#include "moe/kernels/permute.h"
#include "permute_checks.h"

namespace moe::kernel_checks {
namespace {

namespace kd = ::moe::kernels::detail;

bool gpu_ready() { return torch::cuda::is_available() && kernels::cuda_kernels_compiled(); }

PermuteOutputs run_kernels(const PermuteInputs& in) {
  PermuteOutputs out;
  out.rows_of_assignment = kd::assignment_rows(in.source_assignment, in.tokens * in.k);
  out.permuted = kd::permute_forward(in.x, in.rows_of_assignment, in.k, in.source_token.numel(),
                                     /*poison=*/true);
  out.grad_x = kd::permute_backward(in.grad_permuted, in.rows_of_assignment, in.k, true);
  out.combined = kd::combine_forward(in.y, in.rows_of_assignment, in.weights, true);
  auto [gy, gw] = kd::combine_backward(in.grad_out, in.y, in.rows_of_assignment, in.weights, true);
  out.grad_y = gy;
  out.grad_w = gw;
  return out;
}

class PermuteGpu : public ::testing::TestWithParam<PermuteCase> {
 protected:
  void SetUp() override {
    if (!gpu_ready()) GTEST_SKIP() << "no CUDA device, or built without the CUDA kernels";
  }
};

TEST_P(PermuteGpu, ForwardAndBackwardMatchReference) {
  const PermuteInputs in = make_permute_inputs(GetParam(), torch::Device(torch::kCUDA));
  const PermuteOutputs out = run_kernels(in);
  const auto vs = check_permute(in, out);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);

  // The autograd ops run the same kernels: bitwise the raw results.
  auto x = in.x.clone().requires_grad_(true);
  auto w = in.weights.clone().requires_grad_(true);
  auto permuted = kernels::permute(x, in.source_token, in.source_assignment, in.k);
  EXPECT_TRUE(torch::equal(permuted, out.permuted));
  auto y = in.y.clone().requires_grad_(true);
  auto combined = kernels::combine(y, in.source_token, in.source_assignment, w, in.tokens);
  EXPECT_TRUE(torch::equal(combined, out.combined));
  combined.backward(in.grad_out);
  EXPECT_TRUE(torch::equal(y.grad(), out.grad_y));
  EXPECT_TRUE(torch::equal(w.grad(), out.grad_w));
  permuted.backward(in.grad_permuted);
  EXPECT_TRUE(torch::equal(x.grad(), out.grad_x));

  // Run to run: bitwise equal (no atomics).
  const PermuteOutputs again = run_kernels(in);
  EXPECT_TRUE(torch::equal(again.grad_x, out.grad_x));
  EXPECT_TRUE(torch::equal(again.combined, out.combined));
  EXPECT_TRUE(torch::equal(again.grad_w, out.grad_w));
}

INSTANTIATE_TEST_SUITE_P(Grid, PermuteGpu, ::testing::ValuesIn(permute_cases()),
                         [](const auto& i) { return case_name(i.param); });
INSTANTIATE_TEST_SUITE_P(Shapes, PermuteGpu, ::testing::ValuesIn(permute_shape_cases()),
                         [](const auto& i) { return case_name(i.param); });

// The dropless plan kernel (counts -> prefix sum -> stable rows) against the sort-based
// reference: bitwise, and run to run. Tiles of 1024 assignments: the grid's T x k covers one
// partial tile, several tiles, and 65537 x 8 (513 tiles). The plan does not depend on a dtype.
class DispatchPlanGpu : public ::testing::TestWithParam<PlanCase> {
 protected:
  void SetUp() override {
    if (!gpu_ready()) GTEST_SKIP() << "no CUDA device, or built without the CUDA kernels";
  }
};

TEST_P(DispatchPlanGpu, MatchesReference) {
  const PlanCase c = GetParam();
  auto idx = make_plan_topk(c, torch::Device(torch::kCUDA));
  auto [st, sa, counts] = kd::dispatch_plan(idx, c.experts, /*poison=*/true);
  const auto vs = check_plan(idx, c.experts, {st, sa, counts});
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  auto again = kd::dispatch_plan(idx, c.experts, true);
  EXPECT_TRUE(torch::equal(again[1], sa));
}

INSTANTIATE_TEST_SUITE_P(PlanGrid, DispatchPlanGpu, ::testing::ValuesIn(plan_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(PermuteGpuPoison, EveryOutputIsWritten) {
  if (!gpu_ready()) GTEST_SKIP() << "no CUDA device";
  auto dev = torch::TensorOptions(torch::kCUDA);
  auto x = torch::arange(0, 5 * 8, dev.dtype(torch::kFloat)).view({5, 8});
  // Tokens 0 and 3 (k = 1): rows 1 and 0; tokens 1, 2, 4 dropped. Every row written.
  auto rows = torch::tensor({1, -1, -1, 0, -1}, dev.dtype(torch::kLong));
  auto out = kd::permute_forward(x, rows, 1, 2, /*poison=*/true);
  EXPECT_TRUE(torch::equal(out, x.index_select(0, torch::tensor({3, 0}, dev.dtype(torch::kLong)))));
  // The poison is really there: a row no assignment maps to keeps its NaN.
  auto gap = kd::permute_forward(x, rows, 1, 3, true);
  EXPECT_TRUE(gap[2].isnan().all().item<bool>()) << gap;
#ifdef NDEBUG
  // A row index out of range (argument checks off) is skipped by the release kernel instead of
  // written out of bounds. (Debug builds assert instead.)
  const bool checks = kernels::argument_checks();
  kernels::set_argument_checks(false);
  auto bad = kd::permute_forward(x, torch::tensor({1, -1, -1, 9, -1}, dev.dtype(torch::kLong)), 1,
                                 2, true);
  kernels::set_argument_checks(checks);
  EXPECT_TRUE(bad[0].isnan().all().item<bool>()) << bad;
  EXPECT_TRUE(torch::equal(bad[1], x[0]));
#endif
}

// Index values a caller can get wrong are refused with the value and its position when
// argument checks are on (debug builds, MOE_KERNEL_ARG_CHECKS=1, or set_argument_checks).
TEST(KernelArgsGpu, OutOfRangeIndicesAreRefusedWithValues) {
  if (!gpu_ready()) GTEST_SKIP() << "no CUDA device";
  const bool checks = kernels::argument_checks();
  kernels::set_argument_checks(true);
  auto dev = torch::TensorOptions(torch::kCUDA).dtype(torch::kLong);
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
          << e.what_without_backtrace();
    }
  };
  auto idx = torch::tensor({{0, 1}, {2, -1}}, dev);
  expect_error([&] { kd::dispatch_plan(idx, 4); }, "holds -1 at position 3");
  auto big = torch::tensor({{0, 1}, {2, 4}}, dev);
  expect_error([&] { kd::dispatch_plan(big, 4); },
               "holds 4 at position 3 of 4; expected values in [0, 4)");
  auto x = torch::randn({3, 8}, torch::TensorOptions(torch::kCUDA));
  expect_error(
      [&] {
        kd::permute_forward(x, torch::tensor({0, -1, 3}, dev), 1, 2);
      },
      "rows_of_assignment holds 3");
  expect_error(
      [&] {
        kd::assignment_rows(torch::tensor({0, 5}, dev), 4);
      },
      "source_assignment holds 5");
  auto g = torch::randn({2, 8}, torch::TensorOptions(torch::kCUDA));
  expect_error(
      [&] {
        kd::permute_backward(g, torch::tensor({0, 2}, dev), 1);
      },
      "rows_of_assignment holds 2");
  kernels::set_argument_checks(checks);
}

}  // namespace
}  // namespace moe::kernel_checks
