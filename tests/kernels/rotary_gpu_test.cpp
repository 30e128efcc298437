// The rotary kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a device): the raw
// launches over the emulation's grid (poisoned outputs: an unwritten element fails), the
// autograd op, and attention with the fused rotation against attention with the reference one
// under bf16 autocast: the same outputs and gradients, bit for bit.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "moe/kernels/rotary.h"
#include "moe/model/transformer.h"
#include "rotary_checks.h"

namespace moe::kernel_checks {
namespace {

class RotaryGpu : public ::testing::TestWithParam<RotaryCase> {};
TEST_P(RotaryGpu, PassesTheChecks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const RotaryInputs in = make_rotary_inputs(GetParam(), torch::Device(torch::kCUDA));
  RotaryOutputs got;
  got.out = kernels::detail::rotary_apply(in.x, in.cos, in.sin, false, /*poison=*/true);
  got.grad_x = kernels::detail::rotary_apply(in.grad, in.cos, in.sin, true, /*poison=*/true);
  const auto vs = check_rotary(in, got);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  // The autograd op: the same forward, and its backward is the raw backward.
  const auto x = in.x.detach().requires_grad_(true);
  const auto y = kernels::rotary(x, in.cos, in.sin);
  y.backward(in.grad);
  EXPECT_TRUE(torch::equal(y.detach(), got.out));
  EXPECT_TRUE(torch::equal(x.grad(), got.grad_x));
}
INSTANTIATE_TEST_SUITE_P(Grid, RotaryGpu, ::testing::ValuesIn(rotary_cases()),
                         [](const auto& i) { return case_name(i.param); });

// Deterministic algorithms for one test (SDPA's backward accumulates dQ with atomics across key
// blocks otherwise), restored after it: the GPU tests share one process.
struct DeterministicAlgorithms {
  DeterministicAlgorithms()
      : was(at::globalContext().deterministicAlgorithms()),
        warn_only(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  ~DeterministicAlgorithms() { at::globalContext().setDeterministicAlgorithms(was, warn_only); }
  bool was, warn_only;
};

TEST(RotaryAttentionGpu, FusedAndReferenceAttentionAreBitwiseEqualUnderBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  DeterministicAlgorithms deterministic;
  for (int64_t kv_heads : {8, 2}) {  // multi-head and grouped-query attention
    SCOPED_TRACE(kv_heads);
    model::AttentionOptions o;
    o.hidden = 512, o.heads = 8, o.kv_heads = kv_heads, o.head_dim = 64, o.rope_theta = 10000;
    torch::manual_seed(3);
    model::CausalSelfAttention reference(o);
    o.fused_rotary = true;
    model::CausalSelfAttention fused(o);
    {
      torch::NoGradGuard g;
      fused->qkv->weight.copy_(reference->qkv->weight);
      fused->out->weight.copy_(reference->out->weight);
    }
    reference->to(torch::kCUDA);
    fused->to(torch::kCUDA);
    const auto x = torch::randn({2, 128, 512}, torch::TensorOptions(torch::kCUDA));
    const auto g = torch::randn({2, 128, 512}, torch::TensorOptions(torch::kCUDA));
    auto run = [&](model::CausalSelfAttention& a) {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      const auto xi = x.clone().requires_grad_(true);
      auto y = a->forward(xi);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      y.backward(g.to(y.scalar_type()));
      return std::make_tuple(y.detach(), xi.grad(), a->qkv->weight.grad().clone());
    };
    const auto [y_ref, gx_ref, gw_ref] = run(reference);
    const auto [y, gx, gw] = run(fused);
    EXPECT_TRUE(torch::equal(y, y_ref));
    EXPECT_TRUE(torch::equal(gx, gx_ref));
    EXPECT_TRUE(torch::equal(gw, gw_ref));
  }
}

}  // namespace
}  // namespace moe::kernel_checks
