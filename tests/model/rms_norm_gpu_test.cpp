// RMSNorm on a GPU (label `gpu`, in moe_gpu_tests; skipped without a device): a bf16 input with
// the fp32 weight (q_norm/k_norm under autocast) must take torch's fused kernel, not the composite
// fallback, with the input's dtype out, and forward and both gradients within the rounding of the
// weight to bf16 of the double-precision result; an fp32 input is unchanged (fused already); an
// fp16 input keeps the composite path (an fp32 weight gradient) within its rounding.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

#include "../kernels/check_util.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

namespace kc = ::moe::kernel_checks;

TEST(RmsNormGpu, Bf16InputTakesTheFusedKernelWithinRounding) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  const double eps = 1e-6;
  for (auto dt : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    // Per head (Qwen3-MoE, [B, S, H, hd]) and over a whole projection (OLMoE, [B, S, H hd]).
    for (auto shape : {std::vector<int64_t>{3, 37, 8, 128}, std::vector<int64_t>{3, 37, 1024}}) {
      const int64_t dim = shape.back();
      SCOPED_TRACE(std::string(c10::toString(dt)) + " dim " + std::to_string(dim));
      torch::manual_seed(11);
      RMSNorm norm(dim, eps);
      {
        torch::NoGradGuard g;  // trained-looking values, not bf16-exact
        norm->weight.copy_(1 + 0.3 * torch::randn({dim}));
      }
      norm->to(cuda);
      const auto x = (torch::randn(shape) * 2).to(cuda).to(dt).requires_grad_(true);
      const auto gy = torch::randn(shape).to(cuda).to(dt);
      const auto y = norm->forward(x);
      EXPECT_EQ(y.scalar_type(), dt);
      ASSERT_TRUE(y.grad_fn());
      const bool fused = y.grad_fn()->name().find("FusedRmsNorm") != std::string::npos;
      EXPECT_EQ(fused, dt != torch::kHalf) << y.grad_fn()->name();
      y.backward(gy);

      // Oracle in double from the values the kernel saw (the weight as bf16 holds it, on the
      // fused bf16 path; fp32 otherwise).
      const auto f64 = torch::kDouble;
      const auto xd = x.detach().to(f64).requires_grad_(true);
      const auto w_seen =
          dt == torch::kBFloat16 ? norm->weight.detach().to(dt) : norm->weight.detach();
      const auto wd = w_seen.to(f64).requires_grad_(true);
      const auto ref = xd * torch::rsqrt(xd.square().mean(-1, true) + eps) * wd;
      const auto grads = torch::autograd::grad({ref}, {xd, wd}, {gy.to(f64)});
      // fp32 reductions over `dim` and products: a few fp32 roundings relative, plus an absolute
      // term for grad_x, whose two terms cancel (the mean's fp32 error times x); then one
      // rounding to dt (half an ulp). The weight gradient sums 111 or 888 rows in fp32 first.
      // A wiring error (another axis, a missing term) moves elements by about rms(ref).
      auto tol = [&](const torch::Tensor& r) {
        return 0.5 * kc::ulp(r.abs() * (1 + 0x1p-12), dt) + 0x1p-16 * r.abs() +
               0x1p-14 * r.square().mean().sqrt();
      };
      const auto r = ref.detach();
      // fp16's composite path rounds x's gradient as two partials, gw rstd and x rstd^3
      // mean(gw x), before it adds them: half an ulp of each more.
      auto tol_x = tol(grads[0]);
      if (dt == torch::kHalf) {
        torch::NoGradGuard no_grad;
        const auto xv = xd.detach(), gw = gy.to(f64) * wd.detach();
        const auto rstd = torch::rsqrt(xv.square().mean(-1, true) + eps);
        const auto p1 = gw * rstd, p2 = xv * rstd.pow(3) * (gw * xv).mean(-1, true);
        tol_x = tol_x + kc::ulp(p1.abs() + p2.abs(), dt);
      }
      const std::vector<kc::Verdict> vs = {
          kc::within("y", y.detach(), r, tol(r)), kc::within("grad_x", x.grad(), grads[0], tol_x),
          kc::within(
              "grad_w", norm->weight.grad(), grads[1],
              0.5 * kc::ulp(grads[1].abs() * (1 + 0x1p-12), dt) + 0x1p-12 * grads[1].abs().max())};
      EXPECT_TRUE(kc::all_ok(vs, nullptr)) << kc::failures(vs);
      EXPECT_EQ(norm->weight.grad().scalar_type(), torch::kFloat);
    }
  }
}

// As in the model: q from a projection under bf16 autocast, normalised per head.
TEST(RmsNormGpu, QueryNormUnderAutocastTakesTheFusedKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(12);
  torch::nn::Linear proj(torch::nn::LinearOptions(256, 256).bias(false));
  RMSNorm norm(64, 1e-6);
  proj->to(cuda);
  norm->to(cuda);
  const auto x = torch::randn({2, 9, 256}, torch::TensorOptions(cuda));
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const auto q = norm->forward(proj->forward(x).view({2, 9, 4, 64}));
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  EXPECT_EQ(q.scalar_type(), torch::kBFloat16);
  ASSERT_TRUE(q.grad_fn());
  EXPECT_NE(q.grad_fn()->name().find("FusedRmsNorm"), std::string::npos) << q.grad_fn()->name();
  q.sum().backward();
  EXPECT_EQ(norm->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(norm->weight.grad().isfinite().all().item<bool>());
}

}  // namespace
}  // namespace moe::model
