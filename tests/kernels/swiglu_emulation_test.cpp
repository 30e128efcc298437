// The SwiGLU family's GPU checks (swiglu_checks.h) run on the CPU with the kernels' emulation
// (swiglu_emulation.h) over the GPU test's grid, the pack width the launcher picks, and mutation
// cases that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/swiglu.h"
#include "swiglu_checks.h"
#include "swiglu_emulation.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
const torch::Device kCpu(torch::kCPU);

class SwigluEmulation : public ::testing::TestWithParam<SwigluCase> {};
TEST_P(SwigluEmulation, PassesTheGpuChecks) {
  const SwigluInputs in = make_swiglu_inputs(GetParam(), kCpu);
  const auto vs = check_swiglu(in, emu::swiglu_all(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, SwigluEmulation, ::testing::ValuesIn(swiglu_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(SwigluShape, PacksWhereEveryBufferIsAlignedElseOneElement) {
  auto vec = [](const SwigluCase& c) {
    const SwigluInputs in = make_swiglu_inputs(c, kCpu);
    return kernels::detail::swiglu_shape(in.gate, in.up, {&in.grad}).vec;
  };
  EXPECT_EQ(vec({torch::kBFloat16, 7, 64, false}), 8);
  EXPECT_EQ(vec({torch::kFloat, 7, 64, false}), 4);
  EXPECT_EQ(vec({torch::kHalf, 3, 5, false}), 1);  // 15 elements: no whole packs
  EXPECT_EQ(vec({torch::kBFloat16, 33, 1024, true}), 1);
  const SwigluInputs in = make_swiglu_inputs({torch::kFloat, 2, 4104, false}, kCpu);
  const auto s = kernels::detail::swiglu_shape(in.gate, in.up);
  EXPECT_EQ(s.n, 2 * 4104);
  EXPECT_EQ(kernels::swiglu_rows::thread_count(s), 2 * 4104 / 4);
}

TEST(SwigluShape, PackedRowsAreStridedAndPackWhereEveryRowIsAligned) {
  auto shape = [](const SwigluCase& c) {
    const SwigluInputs in = make_swiglu_inputs(c, kCpu);
    return kernels::detail::swiglu_packed_shape(in.gate_up, {&in.grad});
  };
  const auto s = shape({torch::kBFloat16, 33, 1024, false, true});
  EXPECT_EQ(s.vec, 8);
  EXPECT_EQ(s.n, 33 * 1024);
  EXPECT_EQ(s.cols, 1024);
  EXPECT_EQ(s.stride, 2048);
  EXPECT_EQ(shape({torch::kFloat, 7, 64, false, true}).vec, 4);
  EXPECT_EQ(shape({torch::kFloat, 3, 5, false, true}).vec, 1);  // up starts 5 elements in
  EXPECT_EQ(shape({torch::kHalf, 2, 4104, true, true}).vec, 1);
  // The k-th element of h is row k / cols, column k % cols of gate and of up.
  EXPECT_EQ(kernels::swiglu_rows::operand_offset(s, 0), 0);
  EXPECT_EQ(kernels::swiglu_rows::operand_offset(s, 1023), 1023);
  EXPECT_EQ(kernels::swiglu_rows::operand_offset(s, 1024), 2048);
  EXPECT_EQ(kernels::swiglu_rows::operand_offset(s, 5 * 1024 + 8), 10 * 1024 + 8);
  // Separate operands: one flat row, offsets are the index itself.
  const SwigluInputs sep = make_swiglu_inputs({torch::kFloat, 7, 64, false}, kCpu);
  const auto flat = kernels::detail::swiglu_shape(sep.gate, sep.up);
  EXPECT_EQ(kernels::swiglu_rows::operand_offset(flat, 200), 200);
}

TEST(SwigluShape, BadPackedArgumentsAreNamed) {
  const SwigluInputs in = make_swiglu_inputs({torch::kFloat, 7, 64, false, true}, kCpu);
  const auto odd = torch::zeros({7, 63});
  EXPECT_THROW(kernels::detail::swiglu_packed_shape(odd), c10::Error);
  EXPECT_THROW(kernels::detail::swiglu_packed_shape(in.gate_up.to(torch::kDouble)), c10::Error);
  const auto wide = torch::zeros({7, 128});  // an h shaped like gate_up, not like one half
  EXPECT_THROW(kernels::detail::swiglu_packed_shape(in.gate_up, {&wide}), c10::Error);
  EXPECT_THROW(kernels::detail::swiglu_packed_shape(in.gate_up, {}, {&in.grad}), c10::Error);
  EXPECT_THROW(kernels::detail::swiglu_packed_shape(in.gate_up.t().contiguous().t()), c10::Error);
  EXPECT_FALSE(kernels::swiglu_packed_supported(in.gate_up));
  EXPECT_TRUE(torch::equal(kernels::swiglu_packed_activation(in.gate_up, /*fused=*/true),
                           torch::silu(in.gate) * in.up));
}

TEST(SwigluShape, BadArgumentsAreNamed) {
  const SwigluInputs in = make_swiglu_inputs({torch::kFloat, 7, 64, false}, kCpu);
  EXPECT_THROW(kernels::detail::swiglu_shape(in.gate, in.up.to(torch::kHalf)), c10::Error);
  EXPECT_THROW(kernels::detail::swiglu_shape(in.gate, in.up.narrow(0, 0, 6)), c10::Error);
  EXPECT_THROW(kernels::detail::swiglu_shape(in.gate, in.up.t()), c10::Error);  // not contiguous
  const auto d = in.gate.to(torch::kDouble);
  EXPECT_THROW(kernels::detail::swiglu_shape(d, d), c10::Error);
  // On the CPU the FFNs take the reference, whatever they ask for.
  EXPECT_FALSE(kernels::swiglu_supported(in.gate, in.up));
  EXPECT_TRUE(torch::equal(kernels::swiglu_activation(in.gate, in.up, /*fused=*/true),
                           torch::silu(in.gate) * in.up));
  EXPECT_TRUE(torch::equal(kernels::geglu_activation(in.gate, in.up, /*fused=*/true),
                           torch::gelu(in.gate, "tanh") * in.up));
  EXPECT_TRUE(torch::equal(
      kernels::geglu_packed_activation(torch::cat({in.gate, in.up}, -1), /*fused=*/true),
      torch::gelu(in.gate, "tanh") * in.up));
}

// The GeGLU gate's fp32 body against ATen's CPU gelu(tanh) and its backward (another tanh and
// order of operations): the same function within 1e-6, and the derivative within 4e-6, where
// tanh's last-ulp error is multiplied by up to ~7 (2 |t| 0.5 |x| b (1 + 3k x^2) near |x| = 3);
// and its constants ATen's. The double oracle above is the kernels' real bar.
TEST(SwigluShape, GeluGateFollowsAtenGelu) {
  namespace rows = kernels::swiglu_rows;
  EXPECT_EQ(rows::kGeluBeta, static_cast<float>(std::sqrt(2.0 / M_PI)));
  const auto x = torch::linspace(-12, 12, 4801, torch::kFloat);
  auto ours = torch::empty_like(x), grad = torch::empty_like(x);
  const auto xs = x.accessor<float, 1>();
  auto os = ours.accessor<float, 1>(), gs = grad.accessor<float, 1>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    os[i] = rows::gelu_tanh_f(xs[i]);
    gs[i] = rows::gelu_tanh_grad_f(1.f, xs[i]);
  }
  const auto ref = torch::gelu(x, "tanh");
  const auto ref_grad = torch::gelu_backward(torch::ones_like(x), x, "tanh");
  EXPECT_TRUE(torch::allclose(ours, ref, 1e-6, 1e-6)) << (ours - ref).abs().max();
  EXPECT_TRUE(torch::allclose(grad, ref_grad, 1e-6, 4e-6)) << (grad - ref_grad).abs().max();
  // Not silu's: the two gates differ by far.
  EXPECT_GT((ours - torch::silu(x)).abs().max().item<double>(), 0.1);
}

// ---- mutations: each check can fail -----------------------------------------------------------

TEST(KernelCheckMutations, SwigluSkippedSwappedDerivativeAndFewUlpFail) {
  using kernels::swiglu_rows::Gate;
  for (const SwigluCase& c :
       {SwigluCase{torch::kBFloat16, 33, 1024, false}, SwigluCase{torch::kHalf, 2, 4104, true},
        SwigluCase{torch::kFloat, 7, 64, false},
        SwigluCase{torch::kBFloat16, 33, 1024, false, true},
        SwigluCase{torch::kFloat, 2, 4104, true, true},
        SwigluCase{torch::kBFloat16, 33, 1024, false, false, Gate::kGeluTanh},
        SwigluCase{torch::kHalf, 2, 4104, true, true, Gate::kGeluTanh},
        SwigluCase{torch::kFloat, 7, 64, false, true, Gate::kGeluTanh},
        SwigluCase{torch::kFloat, 2, 4104, true, false, Gate::kGeluTanh}}) {
    SCOPED_TRACE(case_name(c));
    const SwigluInputs in = make_swiglu_inputs(c, kCpu);
    const SwigluOutputs good = emu::swiglu_all(in);
    const auto vs = check_swiglu(in, good);
    ASSERT_TRUE(all_ok(vs, nullptr)) << failures(vs);
    // fp32 outputs carry the error of ~6 fp32 roundings and expf's (tanhf's): a tolerance of a
    // few ulp of their own dtype (6.2 at SwiGLU's grad_gate's tightest). 16-bit outputs: 0.5-0.8
    // ulp there.
    const double off = c.dtype == torch::kFloat ? 16 : 4;
    for (const char* name : {"h", "grad_gate", "grad_up"}) {
      EXPECT_LT(find(vs, name).tightest_ulps, off) << name;  // the nudges below must fail
    }
    // The grid one thread short: the last pack of every output stays unwritten.
    auto bad = check_swiglu(in, emu::swiglu_all(in, emu::SwigluFault::kLastPackSkipped));
    for (const char* name : {"h", "grad_gate", "grad_up"}) EXPECT_FALSE(find(bad, name).ok());
    bad = check_swiglu(in, emu::swiglu_all(in, emu::SwigluFault::kOperandsSwapped));
    for (const char* name : {"h", "grad_gate", "grad_up"}) EXPECT_FALSE(find(bad, name).ok());
    if (c.packed) {  // every row after the first read from the wrong place
      bad = check_swiglu(in, emu::swiglu_all(in, emu::SwigluFault::kRowStrideIgnored));
      for (const char* name : {"h", "grad_gate", "grad_up"}) EXPECT_FALSE(find(bad, name).ok());
    }
    expect_fails_only(
        check_swiglu(in, emu::swiglu_all(in, emu::SwigluFault::kDerivativePartDropped)),
        "grad_gate");
    // A gate checked against the other gate's oracle fails every output.
    SwigluInputs other = in;
    other.gate_fn = c.gate == Gate::kSilu ? Gate::kGeluTanh : Gate::kSilu;
    bad = check_swiglu(other, good);
    for (const char* name : {"h", "grad_gate", "grad_up"}) EXPECT_FALSE(find(bad, name).ok());
    // One element `off` ulp off, where each tolerance is tightest.
    SwigluOutputs nudge = good;
    nudge.h = nudged(good.h, find(vs, "h").tightest, off);
    expect_fails_only(check_swiglu(in, nudge), "h");
    nudge = good;
    nudge.grad_gate = nudged(good.grad_gate, find(vs, "grad_gate").tightest, off);
    expect_fails_only(check_swiglu(in, nudge), "grad_gate");
    nudge = good;
    nudge.grad_up = nudged(good.grad_up, find(vs, "grad_up").tightest, off);
    expect_fails_only(check_swiglu(in, nudge), "grad_up");
  }
}

}  // namespace
}  // namespace moe::kernel_checks
