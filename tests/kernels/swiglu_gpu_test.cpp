// The SwiGLU kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a device): the raw
// launches over the emulation's grid (poisoned outputs: an unwritten element fails) against the
// double-precision oracle; the autograd op (bit for bit: the same launches); and the experts
// (grouped GEMMs and per-expert GEMMs) and the dense FFN with the fused activation under bf16
// autocast against the experts' oracle. Bit equality with ATen's silu * up, and with the modules
// built on it, depends on how nvcc compiled `1.f + expf(-x)` here and in PyTorch's build: it is
// reported ("[ mismatch ]" lines and the XML report's properties), not asserted.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <array>
#include <iostream>

#include "experts_checks.h"
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
  const auto gate_fn = GetParam().gate;
  const bool gelu = gate_fn == kernels::swiglu_rows::Gate::kGeluTanh;
  if (GetParam().packed) {
    got.h = kernels::detail::swiglu_packed_forward(in.gate_up, /*poison=*/true, gate_fn);
    const auto d =
        kernels::detail::swiglu_packed_backward(in.grad, in.gate_up, /*poison=*/true, gate_fn);
    got.grad_gate = d.narrow(-1, 0, f), got.grad_up = d.narrow(-1, f, f);
  } else {
    got.h = kernels::detail::swiglu_forward(in.gate, in.up, /*poison=*/true, gate_fn);
    std::tie(got.grad_gate, got.grad_up) =
        kernels::detail::swiglu_backward(in.grad, in.gate, in.up, /*poison=*/true, gate_fn);
  }
  // The double-precision oracle gates. The kernel's difference from ATen (none where nvcc built
  // `1.f + expf(-x)` (gelu: its tanhf and sums) as PyTorch's build did) is reported, and so is
  // how ATen's own outputs fare against the oracle, whose tolerance is derived for the kernel's
  // arithmetic (ATen's may contract differently).
  const auto vs = check_swiglu(in, got);
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  const SwigluOutputs aten = swiglu_aten(in);
  for (const auto& m : swiglu_aten_mismatches(aten, got)) report(m);
  int64_t aten_outside = 0;
  for (const auto& v : check_swiglu(in, aten)) aten_outside += v.failed;
  RecordProperty("aten_outside_oracle", std::to_string(aten_outside));
  if (aten_outside > 0)
    std::cout << "[ mismatch ] ATen outside the oracle: " << aten_outside << "\n";
  // The autograd op: the same forward, and its backward is the raw backward.
  if (GetParam().packed) {
    const auto gu = in.gate_up.detach().requires_grad_(true);
    const auto h = gelu ? kernels::geglu_packed(gu) : kernels::swiglu_packed(gu);
    h.backward(in.grad);
    EXPECT_TRUE(torch::equal(h.detach(), got.h));
    EXPECT_TRUE(torch::equal(gu.grad().narrow(-1, 0, f), got.grad_gate));
    EXPECT_TRUE(torch::equal(gu.grad().narrow(-1, f, f), got.grad_up));
    return;
  }
  const auto g = in.gate.detach().requires_grad_(true), u = in.up.detach().requires_grad_(true);
  const auto h = gelu ? kernels::geglu(g, u) : kernels::swiglu(g, u);
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
  for (bool gelu : {false, true}) {
    for (bool packed : {false, true}) {
      SCOPED_TRACE(std::string(gelu ? "geglu " : "swiglu ") + (packed ? "packed" : "separate"));
      auto second = [&](bool fused) {
        const auto gu = gate_up.detach().requires_grad_(true);
        const auto parts = gu.chunk(2, -1);
        torch::Tensor h;
        if (packed) {
          h = gelu ? kernels::geglu_packed_activation(gu, fused)
                   : kernels::swiglu_packed_activation(gu, fused);
        } else {
          const auto g = parts[0].contiguous(), u = parts[1].contiguous();
          h = gelu ? kernels::geglu_activation(g, u, fused)
                   : kernels::swiglu_activation(g, u, fused);
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

// The five outputs of an FFN run (y, grad_x, the gate, up and down weights' gradients) against
// the same module with the reference activation: reported bit for bit (equal where nvcc built the
// fused activation's `1.f + expf(-x)` as PyTorch's build did; else one bf16 ulp of an activation
// moves the GEMMs after it), and gated on the experts' double-precision oracle (check_experts:
// bf16 rounding where the bf16 path rounds, tolerances from the fp32 accumulation and one-ulp
// flips of intermediates), which a wiring error (a swapped half, a transpose) fails by far.
using FfnOutputs = std::array<torch::Tensor, 5>;
void report_against_reference(const std::string& prefix, const FfnOutputs& got,
                              const FfnOutputs& ref) {
  const char* names[] = {"y", "grad_x", "grad_w_gate", "grad_w_up", "grad_w_down"};
  for (size_t i = 0; i < got.size(); ++i) {
    report(mismatch(prefix + "_" + names[i] + "_vs_reference", got[i], ref[i]));
  }
}

TEST(SwigluFfnGpu, ExpertsWithTheFusedActivationMatchTheOracle) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  // Grouped GEMMs (sm_90) with gate and up as one GEMM (the packed activation) or two, and one
  // GEMM per expert.
  for (int path : {0, 1, 2}) {
    const bool grouped = path < 2;
    if (grouped && !moe::experts_grouped_mm_supported(cuda)) continue;  // sm_90 only
    const std::string name = path == 0 ? "grouped_gate_up" : grouped ? "grouped" : "per_expert";
    SCOPED_TRACE(name);
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
      return FfnOutputs{y, gx, e->w_gate.grad().clone(), e->w_up.grad().clone(),
                        e->w_down.grad().clone()};
    };
    const auto ref = run(reference), got = run(fused);
    report_against_reference("experts_" + name, got, ref);
    ExpertsInputs in{
        x, counts,   fused->w_gate.detach(), fused->w_up.detach(), fused->w_down.detach(),
        g, path == 0};
    const auto vs = check_experts(in, {got[0], got[1], got[2], got[3], got[4]});
    EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  }
}

TEST(SwigluFfnGpu, DenseFfnWithTheFusedActivationMatchesTheOracle) {
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
  auto run = [&](model::DenseMlp& m) {
    const auto [y, gx] = under_bf16([&](const torch::Tensor& xi) { return m->forward(xi); }, x, g);
    // As one expert's [1, in, out] weights (Linear keeps [out, in]).
    auto expert = [](const torch::Tensor& w) { return w.t().unsqueeze(0); };
    return FfnOutputs{y, gx, expert(m->gate_proj->weight.grad()), expert(m->up_proj->weight.grad()),
                      expert(m->down_proj->weight.grad())};
  };
  const auto ref = run(reference), got = run(fused);
  report_against_reference("dense", got, ref);
  // The dense FFN is one expert over every row, gate and up as two GEMMs.
  auto expert = [](const torch::nn::Linear& l) { return l->weight.detach().t().unsqueeze(0); };
  ExpertsInputs in{x,
                   torch::tensor({x.size(0)}, torch::kLong),
                   expert(fused->gate_proj),
                   expert(fused->up_proj),
                   expert(fused->down_proj),
                   g,
                   false};
  const auto vs = check_experts(in, {got[0], got[1], got[2], got[3], got[4]});
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}

// GeGLU (Gemma 4): the experts (grouped GEMMs with gate and up as one GEMM or two, and one GEMM
// per expert) and the dense FFN with the fused gelu gate against the same modules with the ATen
// reference, in fp32 (the kernel's arithmetic is the double oracle's in Grid/SwigluGpu): the
// wiring (which half is the gate, the packed path's activation) is what this checks.
TEST(SwigluFfnGpu, GegluExpertsAndDenseFfnFollowTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  // Relative distance: the grouped GEMMs run in bf16, where an activation one bf16 ulp apart
  // (tanhf against ATen's rounding) moves the GEMMs after it by ~1e-3; a swapped half or the
  // silu gate moves them by ~1.
  const auto distance = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kDouble) - b.to(torch::kDouble)).norm() / b.to(torch::kDouble).norm())
        .item<double>();
  };
  for (int path : {0, 1, 2}) {
    const bool grouped = path < 2;
    if (grouped && !moe::experts_grouped_mm_supported(cuda)) continue;  // sm_90 only
    SCOPED_TRACE(path == 0 ? "grouped_gate_up" : grouped ? "grouped" : "per_expert");
    moe::ExpertsOptions o;
    o.num_experts = 4, o.hidden_size = 256, o.ffn_size = 512, o.grouped_mm = grouped;
    o.fused_gate_up = path == 0;
    o.activation = config::ExpertActivation::kGeglu;
    torch::manual_seed(5);
    moe::Experts reference(o);
    o.fused_swiglu = true;
    torch::manual_seed(5);
    moe::Experts fused(o);
    reference->to(cuda);
    fused->to(cuda);
    EXPECT_EQ(fused->fuses_gate_up(), path == 0);
    const auto counts = torch::tensor({100, 0, 37, 119}, torch::kLong);
    const auto x = torch::randn({256, 256}, torch::TensorOptions(cuda));
    const auto g = torch::randn({256, 256}, torch::TensorOptions(cuda));
    auto run = [&](moe::Experts& e) {
      const auto xi = x.clone().requires_grad_(true);
      const auto y = e->forward(xi, counts);
      y.backward(g.to(y.scalar_type()));
      return FfnOutputs{y.detach().to(torch::kFloat), xi.grad(), e->w_gate.grad().clone(),
                        e->w_up.grad().clone(), e->w_down.grad().clone()};
    };
    const auto ref = run(reference), got = run(fused);
    report_against_reference("geglu_experts", got, ref);
    const double bound = grouped ? 2e-2 : 1e-5;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(distance(got[i], ref[i]), bound) << i;
  }
  torch::manual_seed(6);
  model::DenseMlp reference(256, 768, 0.02, 0.01);
  torch::manual_seed(6);
  model::DenseMlp fused(256, 768, 0.02, 0.01);
  reference->geglu = fused->geglu = true;
  fused->fused_swiglu = true;
  reference->to(cuda);
  fused->to(cuda);
  const auto x = torch::randn({300, 256}, torch::TensorOptions(cuda));
  auto run = [&](model::DenseMlp& m) {
    const auto xi = x.clone().requires_grad_(true);
    const auto y = m->forward(xi);
    y.square().sum().backward();
    return std::make_pair(y.detach(), xi.grad());
  };
  const auto [y_ref, gx_ref] = run(reference);
  const auto [y, gx] = run(fused);
  EXPECT_LT(distance(y, y_ref), 1e-5);  // fp32 throughout
  EXPECT_LT(distance(gx, gx_ref), 1e-5);
  EXPECT_LT(distance(fused->gate_proj->weight.grad(), reference->gate_proj->weight.grad()), 1e-5);
}

}  // namespace
}  // namespace moe::kernel_checks
