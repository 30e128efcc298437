// gpt-oss's clamped SwiGLU kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a
// device): the raw launches over the emulation's grid (poisoned outputs: an unwritten element
// fails) against the double-precision oracle, forward and both gradients; the autograd op (bit
// for bit: the same launches) and the activation's choice; second derivatives through the op.
// Bit equality with ATen's reference depends on how nvcc compiled `1.f + expf(-a)` here and in
// PyTorch's build: it is reported ("[ mismatch ]" lines and the XML report's properties), not
// asserted; ATen's own outputs must pass the oracle.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "clamped_swiglu_checks.h"
#include "moe/kernels/clamped_swiglu.h"

namespace moe::kernel_checks {
namespace {

class ClampedSwigluGpu : public ::testing::TestWithParam<ClampedSwigluCase> {};
TEST_P(ClampedSwigluGpu, PassesTheChecks) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const ClampedSwigluInputs in =
      make_clamped_swiglu_inputs(GetParam(), torch::Device(torch::kCUDA));
  const double limit = in.limit, alpha = in.alpha;
  ClampedSwigluOutputs got;
  got.h = kernels::detail::clamped_swiglu_forward(in.gate, in.up, limit, alpha, /*poison=*/true);
  std::tie(got.grad_gate, got.grad_up) = kernels::detail::clamped_swiglu_backward(
      in.grad, in.gate, in.up, limit, alpha, /*poison=*/true);
  // The double-precision oracle gates: forward, both gradients inside their clamps, exact zeros
  // outside. The difference from ATen (none where nvcc built `1.f + expf(-a)` as PyTorch's
  // build did) is reported, and ATen's own outputs must pass the oracle too.
  const auto vs = check_clamped_swiglu(in, got);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  const ClampedSwigluOutputs aten = clamped_swiglu_aten(in);
  for (const auto& m : clamped_swiglu_aten_mismatches(aten, got)) report(m);
  const auto aten_vs = check_clamped_swiglu(in, aten);
  EXPECT_TRUE(all_ok(aten_vs, nullptr)) << "ATen's reference: " << failures(aten_vs);
  // The autograd op: the same forward, and its backward is the raw backward.
  const auto g = in.gate.detach().requires_grad_(true), u = in.up.detach().requires_grad_(true);
  const auto h = kernels::clamped_swiglu(g, u, limit, alpha);
  h.backward(in.grad);
  EXPECT_TRUE(torch::equal(h.detach(), got.h));
  EXPECT_TRUE(torch::equal(g.grad(), got.grad_gate));
  EXPECT_TRUE(torch::equal(u.grad(), got.grad_up));
}
INSTANTIATE_TEST_SUITE_P(Grid, ClampedSwigluGpu, ::testing::ValuesIn(clamped_swiglu_cases()),
                         [](const auto& i) { return case_name(i.param); });

// Every output element is written: NaN-poisoned outputs come back without a NaN (the inputs have
// none), at sizes that end in a partial block and with one element per thread.
TEST(ClampedSwigluGpuAutograd, PoisonedOutputsAreOverwritten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto opts = torch::TensorOptions(torch::Device(torch::kCUDA)).dtype(torch::kBFloat16);
  torch::manual_seed(3);
  for (int64_t n : {1, 7, 8, 255 * 8 + 3, 257 * 8}) {
    SCOPED_TRACE(n);
    const auto gate = torch::randn({n}, opts) * 8, up = torch::randn({n}, opts) * 8;
    const auto dh = torch::randn({n}, opts);
    const auto h = kernels::detail::clamped_swiglu_forward(gate, up, 7.0, 1.702, true);
    const auto [dg, du] = kernels::detail::clamped_swiglu_backward(dh, gate, up, 7.0, 1.702, true);
    EXPECT_FALSE(h.isnan().any().item<bool>());
    EXPECT_FALSE(dg.isnan().any().item<bool>());
    EXPECT_FALSE(du.isnan().any().item<bool>());
  }
}

// The experts' choice: the fused op on CUDA where asked (the same values as the raw launch), the
// reference otherwise; strided operands (views of an interleaved gate_up, as gpt-oss stores it)
// are taken too.
TEST(ClampedSwigluGpuAutograd, ActivationPicksTheFusedOpOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto opts = torch::TensorOptions(torch::Device(torch::kCUDA)).dtype(torch::kBFloat16);
  torch::manual_seed(4);
  const auto gate_up = torch::randn({64, 2 * 96}, opts) * 5;
  const auto gate = gate_up.slice(-1, 0, 2 * 96, 2), up = gate_up.slice(-1, 1, 2 * 96, 2);
  EXPECT_TRUE(kernels::clamped_swiglu_supported(gate, up));
  EXPECT_FALSE(kernels::clamped_swiglu_supported(gate.to(torch::kDouble), up.to(torch::kDouble)));
  EXPECT_FALSE(kernels::clamped_swiglu_supported(gate, up.to(torch::kHalf)));
  const auto fused = kernels::clamped_swiglu_activation(gate, up, 7.0, 1.702, true);
  EXPECT_TRUE(torch::equal(fused, kernels::detail::clamped_swiglu_forward(
                                      gate.contiguous(), up.contiguous(), 7.0, 1.702)));
  const auto ref = kernels::clamped_swiglu_activation(gate, up, 7.0, 1.702, false);
  EXPECT_TRUE(torch::equal(ref, kernels::clamped_swiglu_reference(gate, up, 7.0, 1.702)));
  // Both pass the oracle (bf16: a few ulp apart at most where exp rounds differently).
  ClampedSwigluInputs in;
  in.gate = gate.contiguous(), in.up = up.contiguous(), in.grad = torch::ones_like(in.gate);
  const ClampedSwigluOutputs o = clamped_swiglu_aten(in);
  const auto vs = check_clamped_swiglu(in, {fused, o.grad_gate, o.grad_up});
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}

// A second derivative (create_graph): the op's backward is then taken with differentiable ATen
// ops, so the gradients of its gradients exist and match the reference's (fp32, to rounding).
TEST(ClampedSwigluGpuAutograd, SecondDerivativesFollowTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto opts = torch::TensorOptions(torch::Device(torch::kCUDA));
  torch::manual_seed(9);
  const auto gate0 = torch::randn({64, 48}, opts) * 5, up0 = torch::randn({64, 48}, opts) * 5;
  const auto dh = torch::randn({64, 48}, opts);
  auto second = [&](bool fused) {
    const auto g = gate0.detach().requires_grad_(true), u = up0.detach().requires_grad_(true);
    const auto h = fused ? kernels::clamped_swiglu(g, u, 7.0, 1.702)
                         : kernels::clamped_swiglu_reference(g, u, 7.0, 1.702);
    const auto first = torch::autograd::grad({h}, {g, u}, {dh}, /*retain_graph=*/true,
                                             /*create_graph=*/true);
    const auto loss = (first[0] * 3).sum() + first[1].square().sum();
    const auto grads = torch::autograd::grad({loss}, {g, u});
    return std::make_tuple(first[0].detach(), first[1].detach(), grads[0], grads[1]);
  };
  const auto [fg, fu, g2, u2] = second(true);
  const auto [rfg, rfu, rg2, ru2] = second(false);
  EXPECT_TRUE(torch::allclose(fg, rfg, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fu, rfu, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(g2, rg2, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(u2, ru2, 1e-4, 1e-5));
  EXPECT_GT(g2.abs().max().item<double>(), 0.1);  // the terms exist, not silently zero
  EXPECT_GT(u2.abs().max().item<double>(), 0.1);
}

}  // namespace
}  // namespace moe::kernel_checks
