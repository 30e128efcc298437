// The grouped-GEMM experts (at::_grouped_mm, CUDA bf16, sm_90) against double-precision oracles
// (label `gpu`; skipped without a device or below sm_90). The comparisons live in
// tests/kernels/experts_checks.cpp and are exercised on the CPU, with an emulation of the bf16
// GEMMs, by tests/kernels/experts_emulation_test.cpp.
//   - one grouped GEMM and both of its gradients: within 1 bf16 ulp (+ the fp32 accumulation
//     bound) of the exact product of the bf16 operands; an expert without rows gets an exactly
//     zero weight gradient (the symptom of pytorch/pytorch#172439 on sm_100);
//   - the experts module, grouped (gate and up as one GEMM or two) and per-expert paths, forward
//     and every gradient, against the double graph that rounds to bf16 where the bf16 path does;
//     every expert receives rows.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "../kernels/experts_checks.h"
#include "moe/moe/experts.h"

namespace moe::moe {
namespace {

namespace kc = ::moe::kernel_checks;

bool grouped_ready() {
  return torch::cuda::is_available() &&
         experts_grouped_mm_supported(torch::Device(torch::kCUDA, 0));
}

kc::GroupedGemmOutputs run_grouped_gemm(const kc::GroupedGemmInputs& in) {
  auto a = in.a.clone().requires_grad_(true);
  auto b = in.b.clone().requires_grad_(true);
  const auto offs = in.counts.cumsum(0).to(torch::kInt);
  auto c = at::_grouped_mm(a, b, offs);
  c.backward(in.grad_c);
  return {c.detach(), a.grad(), b.grad()};
}

TEST(ExpertsGpu, GroupedGemmMatchesOracle) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!grouped_ready()) GTEST_SKIP() << "grouped-GEMM experts are enabled on sm_90 only";
  for (int64_t E : {1, 8, 64}) {
    const auto in = kc::make_grouped_gemm_inputs(E, 1, torch::Device(torch::kCUDA));
    const auto vs = kc::check_grouped_gemm(in, run_grouped_gemm(in));
    EXPECT_TRUE(kc::all_ok(vs, nullptr)) << "E=" << E << "\n" << kc::failures(vs);
  }
}

// Experts without rows are normal in training (a skewed router): their weight gradient must be
// exactly zero. Kept apart from the test above so a failure names this case.
TEST(ExpertsGpu, GroupedGemmEmptyExpertsGetZeroGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!grouped_ready()) GTEST_SKIP() << "grouped-GEMM experts are enabled on sm_90 only";
  auto in = kc::make_grouped_gemm_inputs(8, 0, torch::Device(torch::kCUDA));
  in.counts[0] = 0;
  in.counts[5] = 0;
  const int64_t N = in.counts.sum().item<int64_t>();
  in.a = in.a.narrow(0, 0, N).contiguous();
  in.grad_c = in.grad_c.narrow(0, 0, N).contiguous();
  const auto vs = kc::check_grouped_gemm(in, run_grouped_gemm(in));
  EXPECT_TRUE(kc::all_ok(vs, nullptr)) << kc::failures(vs);
}

TEST(ExpertsGpu, ModuleMatchesOracleOnBothPaths) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!grouped_ready()) GTEST_SKIP() << "grouped-GEMM experts are enabled on sm_90 only";
  for (int64_t E : {1, 8, 64}) {
    auto in = kc::make_experts_inputs(E, torch::Device(torch::kCUDA));
    // Grouped with gate and up as one GEMM (moe.fused_gate_up) or two, and the per-expert loop.
    for (int path : {0, 1, 2}) {
      const bool grouped = path < 2;
      in.fused_gate_up = path == 0;
      SCOPED_TRACE(std::string(path == 0 ? "grouped, one gate-up GEMM"
                               : grouped ? "grouped"
                                         : "per-expert loop") +
                   " E=" + std::to_string(E));
      ExpertsOptions o;
      o.num_experts = E;
      o.hidden_size = in.x.size(1);
      o.ffn_size = in.w_gate.size(2);
      o.grouped_mm = grouped;
      o.fused_gate_up = in.fused_gate_up;
      Experts experts(o);
      experts->to(torch::kCUDA);
      {
        torch::NoGradGuard g;
        experts->w_gate.copy_(in.w_gate);
        experts->w_up.copy_(in.w_up);
        experts->w_down.copy_(in.w_down);
      }
      auto x = in.x.clone().requires_grad_(true);
      // As in training: fp32 activations under bf16 autocast.
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      ASSERT_EQ(experts->uses_grouped_mm(x), grouped);
      auto y = experts->forward(x, grouped ? in.counts : in.counts.cpu());
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      y.backward(in.grad_y.to(y.scalar_type()));  // the engine would round it to bf16 too
      const auto vs = kc::check_experts(in, {y.detach(), x.grad(), experts->w_gate.grad(),
                                             experts->w_up.grad(), experts->w_down.grad()});
      EXPECT_TRUE(kc::all_ok(vs, nullptr)) << kc::failures(vs);
    }
  }
}

}  // namespace
}  // namespace moe::moe
