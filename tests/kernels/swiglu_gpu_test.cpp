// The SwiGLU kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a device): the raw
// launches over the emulation's grid (poisoned outputs: an unwritten element fails) against the
// double-precision oracle and, bit for bit, against ATen's silu * up; the autograd op; and the
// experts (grouped GEMMs and per-expert GEMMs) and the dense FFN with the fused activation
// against the same modules with the reference one under bf16 autocast: equal bit for bit.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "moe/kernels/swiglu.h"
#include "moe/model/transformer.h"
#include "moe/moe/experts.h"
#include "swiglu_checks.h"

namespace moe::kernel_checks {
namespace {

class SwigluGpu : public ::testing::TestWithParam<SwigluCase> {};
TEST_P(SwigluGpu, PassesTheChecks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const SwigluInputs in = make_swiglu_inputs(GetParam(), torch::Device(torch::kCUDA));
  SwigluOutputs got;
  const int64_t f = in.gate.size(-1);
  if (GetParam().packed) {
    got.h = kernels::detail::swiglu_packed_forward(in.gate_up, /*poison=*/true);
    const auto d = kernels::detail::swiglu_packed_backward(in.grad, in.gate_up, /*poison=*/true);
    got.grad_gate = d.narrow(-1, 0, f), got.grad_up = d.narrow(-1, f, f);
  } else {
    got.h = kernels::detail::swiglu_forward(in.gate, in.up, /*poison=*/true);
    std::tie(got.grad_gate, got.grad_up) =
        kernels::detail::swiglu_backward(in.grad, in.gate, in.up, /*poison=*/true);
  }
  auto vs = check_swiglu(in, got);
  const auto aten = check_swiglu_matches_aten(in, got);
  vs.insert(vs.end(), aten.begin(), aten.end());
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  // The autograd op: the same forward, and its backward is the raw backward.
  if (GetParam().packed) {
    const auto gu = in.gate_up.detach().requires_grad_(true);
    const auto h = kernels::swiglu_packed(gu);
    h.backward(in.grad);
    EXPECT_TRUE(torch::equal(h.detach(), got.h));
    EXPECT_TRUE(torch::equal(gu.grad().narrow(-1, 0, f), got.grad_gate));
    EXPECT_TRUE(torch::equal(gu.grad().narrow(-1, f, f), got.grad_up));
    return;
  }
  const auto g = in.gate.detach().requires_grad_(true), u = in.up.detach().requires_grad_(true);
  const auto h = kernels::swiglu(g, u);
  h.backward(in.grad);
  EXPECT_TRUE(torch::equal(h.detach(), got.h));
  EXPECT_TRUE(torch::equal(g.grad(), got.grad_gate));
  EXPECT_TRUE(torch::equal(u.grad(), got.grad_up));
}
INSTANTIATE_TEST_SUITE_P(Grid, SwigluGpu, ::testing::ValuesIn(swiglu_cases()),
                         [](const auto& i) { return case_name(i.param); });

// A second derivative (create_graph): the op's backward is then taken with differentiable ATen
// ops, so the gradients of its gradients exist and match the reference's (fp32, to rounding).
TEST(SwigluGpuAutograd, SecondDerivativesFollowTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto opts = torch::TensorOptions(torch::Device(torch::kCUDA));
  torch::manual_seed(9);
  const auto gate_up = torch::randn({64, 96}, opts) * 2, dh = torch::randn({64, 48}, opts);
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "separate");
    auto second = [&](bool fused) {
      const auto gu = gate_up.detach().requires_grad_(true);
      const auto parts = gu.chunk(2, -1);
      torch::Tensor h;
      if (packed) {
        h = fused ? kernels::swiglu_packed(gu) : kernels::swiglu_packed_reference(gu);
      } else {
        const auto g = parts[0].contiguous(), u = parts[1].contiguous();
        h = fused ? kernels::swiglu(g, u) : kernels::swiglu_reference(g, u);
      }
      const auto first = torch::autograd::grad({h}, {gu}, {dh}, /*retain_graph=*/true,
                                               /*create_graph=*/true)[0];
      const auto loss =
          (first.narrow(-1, 0, 48) * 3).sum() + first.narrow(-1, 48, 48).square().sum();
      return std::make_pair(first.detach(), torch::autograd::grad({loss}, {gu})[0]);
    };
    const auto [first, grad2] = second(true);
    const auto [first_ref, grad2_ref] = second(false);
    EXPECT_TRUE(torch::allclose(first, first_ref, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(grad2, grad2_ref, 1e-4, 1e-5));
    EXPECT_GT(grad2.abs().max().item<double>(), 0.1);  // the term exists, not silently zero
  }
}

// Runs f(x) under bf16 autocast and its backward of `grad`: output, input gradient.
template <typename F>
std::pair<torch::Tensor, torch::Tensor> under_bf16(F&& f, const torch::Tensor& x,
                                                   const torch::Tensor& grad) {
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const auto xi = x.clone().requires_grad_(true);
  auto y = f(xi);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  y.backward(grad.to(y.scalar_type()));
  return {y.detach(), xi.grad()};
}

TEST(SwigluFfnGpu, ExpertsWithTheFusedActivationAreBitwiseEqual) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  // Grouped GEMMs (sm_90) with gate and up as one GEMM (the packed activation) or two, and one
  // GEMM per expert.
  for (int path : {0, 1, 2}) {
    const bool grouped = path < 2;
    if (grouped && !moe::experts_grouped_mm_supported(cuda)) continue;  // sm_90 only
    SCOPED_TRACE(path == 0 ? "grouped, one gate-up GEMM" : grouped ? "grouped" : "per expert");
    moe::ExpertsOptions o;
    o.num_experts = 4, o.hidden_size = 256, o.ffn_size = 512, o.grouped_mm = grouped;
    o.fused_gate_up = path == 0;
    torch::manual_seed(5);
    moe::Experts reference(o);
    o.fused_swiglu = true;
    torch::manual_seed(5);
    moe::Experts fused(o);
    reference->to(cuda);
    fused->to(cuda);
    EXPECT_EQ(fused->fuses_gate_up(), path == 0);
    const auto counts = torch::tensor({100, 0, 37, 119}, torch::kLong);  // one expert idle
    const auto x = torch::randn({256, 256}, torch::TensorOptions(cuda));
    const auto g = torch::randn({256, 256}, torch::TensorOptions(cuda));
    auto run = [&](moe::Experts& e) {
      const auto [y, gx] =
          under_bf16([&](const torch::Tensor& xi) { return e->forward(xi, counts); }, x, g);
      return std::make_tuple(y, gx, e->w_gate.grad().clone(), e->w_up.grad().clone(),
                             e->w_down.grad().clone());
    };
    const auto ref = run(reference), got = run(fused);
    EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(ref)));
    EXPECT_TRUE(torch::equal(std::get<1>(got), std::get<1>(ref)));
    EXPECT_TRUE(torch::equal(std::get<2>(got), std::get<2>(ref)));
    EXPECT_TRUE(torch::equal(std::get<3>(got), std::get<3>(ref)));
    EXPECT_TRUE(torch::equal(std::get<4>(got), std::get<4>(ref)));
  }
}

TEST(SwigluFfnGpu, DenseFfnWithTheFusedActivationIsBitwiseEqual) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(6);
  model::DenseMlp reference(256, 768, 0.02, 0.01);
  torch::manual_seed(6);
  model::DenseMlp fused(256, 768, 0.02, 0.01);
  fused->fused_swiglu = true;
  reference->to(cuda);
  fused->to(cuda);
  const auto x = torch::randn({300, 256}, torch::TensorOptions(cuda));
  const auto g = torch::randn({300, 256}, torch::TensorOptions(cuda));
  const auto [y_ref, gx_ref] =
      under_bf16([&](const torch::Tensor& xi) { return reference->forward(xi); }, x, g);
  const auto [y, gx] =
      under_bf16([&](const torch::Tensor& xi) { return fused->forward(xi); }, x, g);
  EXPECT_TRUE(torch::equal(y, y_ref));
  EXPECT_TRUE(torch::equal(gx, gx_ref));
  EXPECT_TRUE(torch::equal(fused->gate_proj->weight.grad(), reference->gate_proj->weight.grad()));
  EXPECT_TRUE(torch::equal(fused->up_proj->weight.grad(), reference->up_proj->weight.grad()));
}

}  // namespace
}  // namespace moe::kernel_checks
