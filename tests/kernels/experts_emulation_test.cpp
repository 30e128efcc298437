// The experts family's GPU checks (experts_checks.h) run on the CPU with the bf16 grouped GEMM
// and experts module emulated (experts_emulation.h), and mutation cases that must fail them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "experts_checks.h"
#include "experts_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

TEST(ExpertsEmulation, GroupedGemmPassesTheGpuChecks) {
  for (int64_t E : {1, 8, 64}) {
    for (int64_t min_count : {0, 1}) {  // 0: some experts may have no rows
      const GroupedGemmInputs in = make_grouped_gemm_inputs(E, min_count, kCpu);
      const auto vs = check_grouped_gemm(in, emu::grouped_gemm(in));
      EXPECT_TRUE(all_ok(vs, nullptr)) << "E=" << E << "\n" << failures(vs);
    }
  }
}

TEST(ExpertsEmulation, ModulePassesTheGpuChecks) {
  for (int64_t E : {1, 8}) {
    for (bool fused_gate_up : {false, true}) {
      ExpertsInputs in = make_experts_inputs(E, kCpu);
      in.fused_gate_up = fused_gate_up;
      ASSERT_TRUE(in.counts.gt(0).all().item<bool>());
      const auto vs = check_experts(in, emu::experts(in));
      EXPECT_TRUE(all_ok(vs, nullptr)) << "E=" << E << " fused_gate_up=" << fused_gate_up << "\n"
                                       << failures(vs);
    }
  }
}

// ---- mutations: each check can fail -----------------------------------------------------------

TEST(KernelCheckMutations, GroupedGemmAndExpertsFail) {
  const GroupedGemmInputs in = make_grouped_gemm_inputs(8, 1, kCpu);
  const GroupedGemmOutputs good = emu::grouped_gemm(in);
  const auto base = check_grouped_gemm(in, good);
  ASSERT_TRUE(all_ok(base, nullptr)) << failures(base);
  for (const char* name : {"c", "grad_a", "grad_b"}) {
    const Verdict& v = find(base, name);
    ASSERT_LT(v.tightest_ulps, 3.0) << name;
    for (double dir : {4.0, -4.0}) {
      GroupedGemmOutputs bad = good;
      torch::Tensor& t = std::string(name) == "c"        ? bad.c
                         : std::string(name) == "grad_a" ? bad.grad_a
                                                         : bad.grad_b;
      t = nudged(t, v.tightest, dir);
      expect_fails_only(check_grouped_gemm(in, bad), name);
    }
  }
  // An expert without rows whose weight gradient is garbage (pytorch/pytorch#172439's symptom).
  GroupedGemmInputs empty = make_grouped_gemm_inputs(8, 0, kCpu);
  empty.counts[3] = 0;
  empty.a = empty.a.narrow(0, 0, empty.counts.sum().item<int64_t>());
  empty.grad_c = empty.grad_c.narrow(0, 0, empty.a.size(0));
  GroupedGemmOutputs garbage = emu::grouped_gemm(empty);
  ASSERT_TRUE(all_ok(check_grouped_gemm(empty, garbage), nullptr));
  garbage.grad_b = garbage.grad_b.clone();
  garbage.grad_b[3][0][0] = 1.0f;
  EXPECT_FALSE(find(check_grouped_gemm(empty, garbage), "grad_b_empty").ok());

  const ExpertsInputs ein = make_experts_inputs(4, kCpu);
  const ExpertsOutputs eout = emu::experts(ein);
  ASSERT_TRUE(all_ok(check_experts(ein, eout), nullptr));
  ExpertsOutputs row = eout;
  row.y = eout.y.clone();
  row.y[11].zero_();  // a row never written (fresh zeros)
  expect_fails_only(check_experts(ein, row), "y");
  ExpertsOutputs wd = eout;
  wd.grad_w_down = eout.grad_w_down.clone();
  wd.grad_w_down[2].zero_();  // one expert's weight gradient missing
  expect_fails_only(check_experts(ein, wd), "grad_w_down");

  // One gate-up GEMM over the weights concatenated in the wrong order ([up | gate]).
  ExpertsInputs fused = make_experts_inputs(4, kCpu);
  fused.fused_gate_up = true;
  ASSERT_TRUE(all_ok(check_experts(fused, emu::experts(fused)), nullptr));
  ExpertsInputs swapped = fused;
  std::swap(swapped.w_gate, swapped.w_up);
  ExpertsOutputs wrong = emu::experts(swapped);
  std::swap(wrong.grad_w_gate, wrong.grad_w_up);  // each weight's gradient where it belongs
  const auto vs = check_experts(fused, wrong);
  for (const char* name : {"y", "grad_x", "grad_w_gate", "grad_w_up", "grad_w_down"}) {
    EXPECT_FALSE(find(vs, name).ok()) << name;
  }
}

}  // namespace
}  // namespace moe::kernel_checks
