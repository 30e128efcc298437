// The grouped-GEMM experts (at::_grouped_mm, CUDA bf16, sm_90+) against the per-expert GEMM loop
// (label `gpu`; skipped without a device or below sm_90).
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include "moe/moe/experts.h"

namespace moe::moe {
namespace {

TEST(ExpertsGpu, GroupedMmMatchesPerExpertLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!experts_grouped_mm_supported(torch::Device(torch::kCUDA, 0)))
    GTEST_SKIP() << "grouped-GEMM experts are enabled on sm_90 only";
  for (int64_t E : {1, 8, 64}) {
    torch::manual_seed(E);
    ExpertsOptions o;
    o.num_experts = E;
    o.hidden_size = 256;
    o.ffn_size = 512;
    Experts grouped(o);
    o.grouped_mm = false;
    Experts loop(o);
    {
      torch::NoGradGuard g;
      loop->w_gate.copy_(grouped->w_gate);
      loop->w_up.copy_(grouped->w_up);
      loop->w_down.copy_(grouped->w_down);
    }
    grouped->to(torch::kCUDA);
    loop->to(torch::kCUDA);
    // Uneven loads, some experts empty.
    auto counts = torch::randint(0, 300, {E}, torch::kLong);
    if (E > 1) counts[0] = 0;
    const int64_t N = counts.sum().item<int64_t>();
    // As in training: fp32 activations under bf16 autocast.
    auto x = torch::randn({N, 256}, torch::TensorOptions(torch::kCUDA)).requires_grad_(true);
    auto x2 = x.detach().clone().requires_grad_(true);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    ASSERT_TRUE(grouped->uses_grouped_mm(x));
    ASSERT_FALSE(loop->uses_grouped_mm(x2));
    auto y = grouped->forward(x, counts.to(torch::kCUDA));
    auto y2 = loop->forward(x2, counts);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), y2.to(torch::kFloat), 2e-2, 2e-2)) << E;
    auto g = torch::randn_like(y);
    y.backward(g);
    y2.backward(g);
    EXPECT_TRUE(
        torch::allclose(x.grad().to(torch::kFloat), x2.grad().to(torch::kFloat), 2e-2, 2e-2));
    EXPECT_TRUE(torch::allclose(grouped->w_down.grad(), loop->w_down.grad(), 5e-2, 5e-2));
  }
}

}  // namespace
}  // namespace moe::moe
