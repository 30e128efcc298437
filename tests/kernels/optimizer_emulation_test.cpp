// The optimizer kernel's GPU checks (optimizer_checks.h) run on the CPU with adam8bit_step's
// emulation (optimizer_emulation.h) over the GPU test's cases, and mutations that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optimizer_checks.h"
#include "optimizer_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

class Adam8bitEmulation : public ::testing::TestWithParam<Adam8bitCase> {};
TEST_P(Adam8bitEmulation, PassesTheGpuChecks) {
  const Adam8bitInputs in = make_adam8bit_inputs(GetParam(), kCpu);
  const auto vs = check_adam8bit(in, emu::adam8bit_step(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, Adam8bitEmulation, ::testing::ValuesIn(adam8bit_cases()),
                         [](const auto& i) { return case_name(i.param); });

// Each check can fail: a weight off by a thousandth of its step, a code two off, an absmax
// scaled, and a moment updated without the gradient scale.
TEST(KernelCheckMutations, Adam8bitWrongWeightCodeAbsmaxAndScaleFail) {
  const Adam8bitInputs in = make_adam8bit_inputs({4097, 1024.0, 0.01, 3}, kCpu);
  const Adam8bitOutputs good = emu::adam8bit_step(in);
  ASSERT_TRUE(all_ok(check_adam8bit(in, good), nullptr));
  auto failing = [&](auto mutate) {
    Adam8bitOutputs bad{good.param.clone(), good.m_codes.clone(), good.m_absmax.clone(),
                        good.v_codes.clone(), good.v_absmax.clone()};
    mutate(bad);
    return !all_ok(check_adam8bit(in, bad), nullptr);
  };
  EXPECT_TRUE(failing([](Adam8bitOutputs& o) { o.param[100] += 2e-6 * (1 + o.param[100].abs()); }));
  EXPECT_TRUE(failing([](Adam8bitOutputs& o) {
    o.m_codes[300] =
        static_cast<uint8_t>(o.m_codes[300].item<int>() < 128 ? o.m_codes[300].item<int>() + 2
                                                              : o.m_codes[300].item<int>() - 2);
  }));
  EXPECT_TRUE(failing([](Adam8bitOutputs& o) { o.v_absmax[3] *= 1.001; }));
  Adam8bitInputs unscaled = in;
  unscaled.c.grad_scale = 1.0;
  const Adam8bitOutputs wrong = emu::adam8bit_step(unscaled);
  EXPECT_FALSE(all_ok(check_adam8bit(in, wrong), nullptr));
}

}  // namespace
}  // namespace moe::kernel_checks
