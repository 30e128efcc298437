// Our CUDA permute / combine kernels against the ATen reference (label `gpu`; skipped without
// a device). Indices and permutations compare exactly; values per dtype; gradients too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/kernels/permute.h"
#include "moe/moe/dispatcher.h"
#include "moe/moe/router.h"

namespace moe::kernels {
namespace {

struct Case {
  torch::ScalarType dtype;
  int64_t tokens, experts, k;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.dtype << " T=" << c.tokens << " E=" << c.experts << " k=" << c.k;
}

class PermuteGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    if (!cuda_kernels_compiled()) GTEST_SKIP() << "built without CUDA kernels";
  }
};

std::pair<double, double> tolerance(torch::ScalarType t) {
  if (t == torch::kFloat) return {1e-5, 1e-5};
  if (t == torch::kHalf) return {1e-3, 1e-3};
  return {1e-2, 1e-2};  // bf16
}

TEST_P(PermuteGpu, ForwardAndBackwardMatchReference) {
  const Case c = GetParam();
  const int64_t d = 64, k = std::min(c.k, c.experts);
  torch::manual_seed(c.tokens * 31 + c.experts * 7 + k);
  auto dev = torch::Device(torch::kCUDA);
  auto logits = torch::randn({c.tokens, c.experts}, torch::TensorOptions(dev));
  auto [w, idx] = moe::topk_lower_id_wins(torch::softmax(logits, -1), k);
  auto keep = torch::rand({c.tokens, k}, torch::TensorOptions(dev)) > 0.1;
  moe::DispatchPlan plan = moe::plan_dispatch(idx, keep, c.experts);
  auto x =
      torch::randn({c.tokens, d}, torch::TensorOptions(dev).dtype(c.dtype)).requires_grad_(true);
  auto x_ref = x.detach().clone().requires_grad_(true);
  auto weights = (w * keep).contiguous().requires_grad_(true);
  auto weights_ref = weights.detach().clone().requires_grad_(true);

  // Poison: kernel outputs are fresh allocations; fill a guard buffer to catch unwritten rows.
  auto permuted = permute_rows(x, plan.source_token, plan.source_assignment, k);
  auto permuted_ref = moe::permute_tokens(x_ref, plan);
  EXPECT_TRUE(torch::equal(permuted, permuted_ref));  // a copy: bitwise equal

  auto y = permuted * 1.5;
  auto y_ref = permuted_ref * 1.5;
  auto out = unpermute_combine(y, plan.source_token, plan.source_assignment, weights, c.tokens);
  auto out_ref = moe::unpermute_combine(y_ref, plan, weights_ref, c.tokens);
  auto [atol, rtol] = tolerance(c.dtype);
  EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), out_ref.to(torch::kFloat), rtol, atol));

  auto g = torch::randn_like(out);
  out.backward(g);
  out_ref.backward(g);
  EXPECT_TRUE(
      torch::allclose(x.grad().to(torch::kFloat), x_ref.grad().to(torch::kFloat), rtol, atol));
  EXPECT_TRUE(torch::allclose(weights.grad(), weights_ref.grad(), rtol * 10, atol * 10));

  // Run-to-run determinism: bitwise equal outputs.
  auto again = unpermute_combine(y.detach(), plan.source_token, plan.source_assignment,
                                 weights.detach(), c.tokens);
  EXPECT_TRUE(torch::equal(again, out.detach()));
}

// The dropless plan kernel (counts -> prefix sum -> stable rows) against the sort-based
// reference: bitwise equal, and run-to-run identical. Tiles of 1024 assignments: the grid's
// T x k covers one partial tile, several tiles, and 65537 x 8 (513 tiles).
TEST_P(PermuteGpu, DispatchPlanMatchesReference) {
  const Case c = GetParam();
  if (c.dtype != torch::kFloat) GTEST_SKIP() << "the plan does not depend on the dtype";
  const int64_t k = std::min(c.k, c.experts);
  torch::manual_seed(c.tokens * 17 + c.experts * 3 + k);
  auto dev = torch::TensorOptions(torch::Device(torch::kCUDA));
  // Skewed routing: half the assignments go to expert 0, the rest spread out.
  auto logits = torch::randn({c.tokens, c.experts}, dev);
  logits.select(1, 0).add_(1.0);
  auto idx = moe::topk_lower_id_wins(torch::softmax(logits, -1), k).second.contiguous();
  auto keep = torch::ones({c.tokens, k}, dev.dtype(torch::kBool));
  moe::DispatchPlan ref = moe::plan_dispatch(idx, keep, c.experts);
  auto [source_token, source_assignment, counts] = detail::dispatch_plan(idx, c.experts);
  EXPECT_TRUE(torch::equal(source_assignment, ref.source_assignment));
  EXPECT_TRUE(torch::equal(source_token, ref.source_token));
  EXPECT_TRUE(torch::equal(counts, ref.tokens_per_expert));
  auto again = detail::dispatch_plan(idx, c.experts);
  EXPECT_TRUE(torch::equal(again[1], source_assignment));
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t t : {1, 7, 4096, 65537}) {
      for (int64_t e : {1, 8, 64, 256}) {
        for (int64_t k : {1, 2, 8}) {
          if (k <= e) v.push_back({dt, t, e, k});
        }
      }
    }
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  return std::string(dt) + "_T" + std::to_string(c.tokens) + "_E" + std::to_string(c.experts) +
         "_k" + std::to_string(c.k);
}

INSTANTIATE_TEST_SUITE_P(Grid, PermuteGpu, ::testing::ValuesIn(cases()), case_name);

TEST(PermuteGpuPoison, EveryRowIsWritten) {
  if (!torch::cuda::is_available() || !cuda_kernels_compiled()) GTEST_SKIP() << "no CUDA device";
  auto dev = torch::Device(torch::kCUDA);
  auto x = torch::arange(0, 5 * 8, torch::TensorOptions(dev).dtype(torch::kFloat)).view({5, 8});
  auto src = torch::tensor({4, 0, 0, 3}, torch::TensorOptions(dev).dtype(torch::kLong));
  auto out = detail::permute_forward(x, src);
  EXPECT_TRUE(torch::equal(out, x.index_select(0, src)));
}

}  // namespace
}  // namespace moe::kernels
