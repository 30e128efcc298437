// The rotary family's GPU checks (rotary_checks.h) run on the CPU with the kernel's emulation
// (rotary_emulation.h) over the GPU test's grid, the pack width the launcher picks, and mutation
// cases that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/kernels/rotary.h"
#include "rotary_checks.h"
#include "rotary_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

class RotaryEmulation : public ::testing::TestWithParam<RotaryCase> {};
TEST_P(RotaryEmulation, PassesTheGpuChecks) {
  const RotaryInputs in = make_rotary_inputs(GetParam(), kCpu);
  const auto vs = check_rotary(in, emu::rotary_all(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, RotaryEmulation, ::testing::ValuesIn(rotary_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(RotaryShape, PacksWhereEveryRowIsAlignedElseOneElement) {
  auto shape = [](const RotaryCase& c) {
    const RotaryInputs in = make_rotary_inputs(c, kCpu);
    return kernels::detail::rotary_shape(in.x, in.cos, in.sin,
                                         kernels::detail::rotary_output(in.x));
  };
  EXPECT_EQ(shape({torch::kBFloat16, 2, 3, 5, 128, true, false}).vec, 8);
  EXPECT_EQ(shape({torch::kFloat, 2, 3, 5, 128, true, true}).vec, 4);
  EXPECT_EQ(shape({torch::kBFloat16, 2, 3, 5, 16, false, false}).vec, 8);
  EXPECT_EQ(shape({torch::kBFloat16, 2, 3, 5, 6, false, false}).vec, 1);  // 3-element halves
  EXPECT_EQ(shape({torch::kFloat, 2, 3, 5, 2, false, false}).vec, 1);
  const auto s = shape({torch::kBFloat16, 2, 3, 5, 64, true, true});
  EXPECT_EQ(s.x_stride[0], 5 * 9 * 64);  // the projection's strides, not a contiguous copy's
  EXPECT_EQ(s.x_stride[1], 64);
  EXPECT_EQ(s.x_stride[2], 9 * 64);
  EXPECT_EQ(s.table_batch_stride, 5 * 64);
  EXPECT_EQ(kernels::rotary_rows::thread_count(s), 2 * 3 * 5 * (32 / 8));
}

TEST(RotaryShape, BadArgumentsAreNamed) {
  const RotaryInputs in = make_rotary_inputs({torch::kFloat, 2, 3, 5, 16, false, false}, kCpu);
  const auto out = kernels::detail::rotary_output(in.x);
  EXPECT_THROW(
      kernels::detail::rotary_shape(in.x, in.cos.to(torch::kHalf), in.sin.to(torch::kHalf), out),
      c10::Error);
  EXPECT_THROW(kernels::detail::rotary_shape(in.x, in.cos.narrow(0, 0, 4).contiguous(),
                                             in.sin.narrow(0, 0, 4).contiguous(), out),
               c10::Error);
  const auto odd = torch::randn({2, 3, 5, 7});
  EXPECT_THROW(kernels::detail::rotary_shape(odd, in.cos, in.sin, odd), c10::Error);
}

// ---- mutations: each check can fail -----------------------------------------------------------

TEST(KernelCheckMutations, RotaryRoundingSwapUnwrittenAndOneUlpFail) {
  for (const RotaryCase& c : {RotaryCase{torch::kBFloat16, 2, 3, 5, 64, true, false},
                              RotaryCase{torch::kHalf, 2, 3, 5, 16, false, true},
                              RotaryCase{torch::kFloat, 2, 16, 64, 128, true, false}}) {
    SCOPED_TRACE(case_name(c));
    const RotaryInputs in = make_rotary_inputs(c, kCpu);
    const RotaryOutputs good = emu::rotary_all(in);
    ASSERT_TRUE(all_ok(check_rotary(in, good), nullptr));
    // One rounding instead of the reference's two (an fma): some elements differ.
    const auto fused = emu::rotary_all(in, emu::RotaryFault::kFusedMultiplyAdd);
    auto vs = check_rotary(in, fused);
    EXPECT_FALSE(find(vs, "out").ok());
    EXPECT_FALSE(find(vs, "grad_x").ok());
    // The grid one thread short: the last pack stays unwritten.
    vs = check_rotary(in, emu::rotary_all(in, emu::RotaryFault::kLastPackSkipped));
    EXPECT_FALSE(find(vs, "out").ok());
    EXPECT_FALSE(find(vs, "grad_x").ok());
    // The halves of the gradient swapped (the backward's rotation transposed the wrong way).
    RotaryOutputs swapped = good;
    const int64_t h = c.hd / 2;
    swapped.grad_x =
        torch::cat({good.grad_x.narrow(3, h, h), good.grad_x.narrow(3, 0, h)}, 3).contiguous();
    expect_fails_only(check_rotary(in, swapped), "grad_x");
    // One element one ulp off.
    RotaryOutputs nudge = good;
    nudge.out = nudged(good.out.contiguous(), 7, 1);
    expect_fails_only(check_rotary(in, nudge), "out");
  }
}

}  // namespace
}  // namespace moe::kernel_checks
