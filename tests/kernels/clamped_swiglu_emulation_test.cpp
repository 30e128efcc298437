// gpt-oss's clamped SwiGLU: the GPU checks (clamped_swiglu_checks.h) run on the CPU with the
// kernel's emulation (clamped_swiglu_emulation.h) over the GPU test's grid and the pack width the
// launcher picks; the ATen reference on the CPU through the same checks; the clamps' bounds
// (gradients pass at exactly +-limit and stop one ulp beyond, as torch's clamp backward); and
// mutation cases that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <initializer_list>
#include <set>
#include <string>

#include "clamped_swiglu_checks.h"
#include "clamped_swiglu_emulation.h"
#include "moe/kernels/clamped_swiglu.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
using Fault = emu::ClampedSwigluFault;
const torch::Device kCpu(torch::kCPU);

class ClampedSwigluEmulation : public ::testing::TestWithParam<ClampedSwigluCase> {};
TEST_P(ClampedSwigluEmulation, PassesTheGpuChecks) {
  const ClampedSwigluInputs in = make_clamped_swiglu_inputs(GetParam(), kCpu);
  const auto vs = check_clamped_swiglu(in, emu::clamped_swiglu_all(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, ClampedSwigluEmulation, ::testing::ValuesIn(clamped_swiglu_cases()),
                         [](const auto& i) { return case_name(i.param); });

// ATen's reference and its autograd backward on the CPU (SLEEF's exp, ATen's CPU rounding) pass
// the oracle too: the tolerances admit the reference itself, and the oracle's clamp semantics are
// torch's (at the edge values the grid starts with).
class ClampedSwigluReference : public ::testing::TestWithParam<ClampedSwigluCase> {};
TEST_P(ClampedSwigluReference, AtenOnTheCpuPassesTheOracle) {
  const ClampedSwigluInputs in = make_clamped_swiglu_inputs(GetParam(), kCpu);
  const auto vs = check_clamped_swiglu(in, clamped_swiglu_aten(in));
  EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
}
INSTANTIATE_TEST_SUITE_P(Grid, ClampedSwigluReference, ::testing::ValuesIn(clamped_swiglu_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(ClampedSwigluBounds, GradientsPassAtTheLimitAndStopOneUlpBeyond) {
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    const double L = 7.0, du = ulp(torch::tensor(L, f64), dt).item<double>();
    ClampedSwigluInputs in;
    in.gate = torch::tensor({L, L + du, L - du, -L, -L - du, -3.0, 100.0, 0.5}, f64).to(dt);
    in.up = torch::tensor({-L, L, L + du, -L - du, -L + du, 100.0, -100.0, 0.5}, f64).to(dt);
    in.grad = torch::tensor({1.5, -2.0, 0.75, 1.25, -1.0, 3.0, 2.0, 1.0}, f64).to(dt);
    const auto got = emu::clamped_swiglu_all(in);
    const auto aten = clamped_swiglu_aten(in);
    // gate <= L passes: all but L + du and 100; -L <= up <= L: all but L + du, -L - du, +-100.
    const auto want_g = torch::tensor({1, 0, 1, 1, 1, 1, 0, 1}).to(torch::kBool);
    const auto want_u = torch::tensor({1, 1, 0, 0, 1, 0, 0, 1}).to(torch::kBool);
    EXPECT_TRUE(torch::equal(got.grad_gate != 0, want_g)) << got.grad_gate;
    EXPECT_TRUE(torch::equal(got.grad_up != 0, want_u)) << got.grad_up;
    EXPECT_TRUE(torch::equal(aten.grad_gate != 0, want_g)) << aten.grad_gate;
    EXPECT_TRUE(torch::equal(aten.grad_up != 0, want_u)) << aten.grad_up;
    // Beyond a bound the operand counts as the bound: h is that of the operands clamped.
    ClampedSwigluInputs clamped = in;
    clamped.gate = in.gate.clamp_max(L);
    clamped.up = in.up.clamp(-L, L);
    EXPECT_TRUE(torch::equal(emu::clamped_swiglu_all(clamped).h, got.h));
    const auto vs = check_clamped_swiglu(in, got);
    EXPECT_TRUE(all_ok(vs, nullptr)) << failures(vs);
  }
}

// The oracle (explicit formulas in double) is the ATen reference's own autograd in double, the
// clamps' masks included.
TEST(ClampedSwigluBounds, OracleIsTheReferenceInDouble) {
  for (const ClampedSwigluCase& c : {ClampedSwigluCase{torch::kBFloat16, 33, 1024, false},
                                     ClampedSwigluCase{torch::kHalf, 33, 1024, false, 3.3, 0.9},
                                     ClampedSwigluCase{torch::kFloat, 7, 64, false}}) {
    SCOPED_TRACE(case_name(c));
    const ClampedSwigluInputs in = make_clamped_swiglu_inputs(c, kCpu);
    ClampedSwigluInputs wide = in;
    wide.gate = in.gate.to(torch::kDouble), wide.up = in.up.to(torch::kDouble);
    wide.grad = in.grad.to(torch::kDouble);
    wide.limit = clamped_swiglu_bound(in), wide.alpha = clamped_swiglu_alpha(in);
    const auto ref = clamped_swiglu_aten(wide);
    const auto o = clamped_swiglu_oracle(in);
    EXPECT_TRUE(torch::allclose(o.h, ref.h, 1e-13, 1e-13));
    EXPECT_TRUE(torch::allclose(o.grad_gate, ref.grad_gate, 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(o.grad_up, ref.grad_up, 1e-13, 1e-13));
    EXPECT_TRUE(torch::equal(o.grad_gate == 0, ref.grad_gate == 0));
    EXPECT_TRUE(torch::equal(o.grad_up == 0, ref.grad_up == 0));
  }
}

TEST(ClampedSwigluShape, PacksWhereEveryBufferIsAlignedElseOneElement) {
  auto vec = [](const ClampedSwigluCase& c) {
    const ClampedSwigluInputs in = make_clamped_swiglu_inputs(c, kCpu);
    return kernels::detail::clamped_swiglu_shape(in.gate, in.up, {&in.grad}).vec;
  };
  EXPECT_EQ(vec({torch::kBFloat16, 7, 64, false}), 8);
  EXPECT_EQ(vec({torch::kFloat, 7, 64, false}), 4);
  EXPECT_EQ(vec({torch::kHalf, 3, 5, false}), 1);  // 15 elements: no whole packs
  EXPECT_EQ(vec({torch::kBFloat16, 33, 1024, true}), 1);
  const ClampedSwigluInputs in = make_clamped_swiglu_inputs({torch::kFloat, 2, 4104, false}, kCpu);
  const auto s = kernels::detail::clamped_swiglu_shape(in.gate, in.up);
  EXPECT_EQ(s.n, 2 * 4104);
  EXPECT_EQ(kernels::clamped_swiglu_rows::thread_count(s), 2 * 4104 / 4);
}

TEST(ClampedSwigluShape, ScalarsAreTheBoundInTheDtypeAndAlphaInFp32) {
  namespace rows = kernels::clamped_swiglu_rows;
  EXPECT_EQ(rows::clamped_swiglu_params<float>(7.0, 1.702).bound, 7.f);
  EXPECT_EQ(rows::clamped_swiglu_params<c10::BFloat16>(7.0, 1.702).bound, 7.f);
  EXPECT_EQ(rows::clamped_swiglu_params<c10::BFloat16>(7.0, 1.702).alpha, 1.702f);
  // 3.3 in bf16 is 3.296875, in fp16 3.30078125.
  EXPECT_EQ(rows::clamped_swiglu_params<c10::BFloat16>(3.3, 0.9).bound, 3.296875f);
  EXPECT_EQ(rows::clamped_swiglu_params<c10::Half>(3.3, 0.9).bound, 3.30078125f);
  EXPECT_EQ(rows::clamped_swiglu_params<float>(3.3, 0.9).bound, 3.3f);
}

TEST(ClampedSwigluShape, BadArgumentsAreNamed) {
  const ClampedSwigluInputs in = make_clamped_swiglu_inputs({torch::kFloat, 7, 64, false}, kCpu);
  using kernels::detail::clamped_swiglu_shape;
  EXPECT_THROW(clamped_swiglu_shape(in.gate, in.up.to(torch::kHalf)), c10::Error);
  EXPECT_THROW(clamped_swiglu_shape(in.gate, in.up.narrow(0, 0, 6)), c10::Error);
  EXPECT_THROW(clamped_swiglu_shape(in.gate, in.up.t()), c10::Error);  // not contiguous
  const auto wide = torch::zeros({7, 128});
  EXPECT_THROW(clamped_swiglu_shape(in.gate, in.up, {&wide}), c10::Error);
  const auto d = in.gate.to(torch::kDouble);
  EXPECT_THROW(clamped_swiglu_shape(d, d), c10::Error);
  // On the CPU the experts take the reference, whatever they ask for; the raw launches and the
  // fused op refuse CPU tensors (or say the kernels were not built).
  EXPECT_FALSE(kernels::clamped_swiglu_supported(in.gate, in.up));
  EXPECT_TRUE(torch::equal(kernels::clamped_swiglu_activation(in.gate, in.up, 7.0, 1.702, true),
                           kernels::clamped_swiglu_reference(in.gate, in.up, 7.0, 1.702)));
  EXPECT_THROW(kernels::detail::clamped_swiglu_forward(in.gate, in.up, 7.0, 1.702), c10::Error);
  EXPECT_THROW(kernels::detail::clamped_swiglu_backward(in.grad, in.gate, in.up, 7.0, 1.702),
               c10::Error);
}

// ---- mutations: each check can fail -----------------------------------------------------------

// Expects exactly the verdicts named in `failing` to fail.
void expect_fails_exactly(const std::vector<Verdict>& vs,
                          std::initializer_list<const char*> names) {
  const std::set<std::string> failing(names.begin(), names.end());
  for (const auto& v : vs) {
    EXPECT_EQ(!v.ok(), failing.count(v.name) > 0) << v;
  }
}

// The flat index of the k-th element where `mask` holds (within() reports its tightest element
// among the masked-selected ones).
int64_t nth_true(const torch::Tensor& mask, int64_t k) {
  return mask.reshape(-1).nonzero().reshape(-1)[k].item<int64_t>();
}

TEST(KernelCheckMutations, ClampedSwigluClampSidePlusOneMasksAndFewUlpFail) {
  for (const ClampedSwigluCase& c :
       {ClampedSwigluCase{torch::kBFloat16, 33, 1024, false},
        ClampedSwigluCase{torch::kHalf, 2, 4104, true},
        ClampedSwigluCase{torch::kFloat, 7, 64, false},
        ClampedSwigluCase{torch::kBFloat16, 33, 1024, false, 3.3, 0.9}}) {
    SCOPED_TRACE(case_name(c));
    const ClampedSwigluInputs in = make_clamped_swiglu_inputs(c, kCpu);
    const ClampedSwigluOutputs good = emu::clamped_swiglu_all(in);
    const auto vs = check_clamped_swiglu(in, good);
    ASSERT_TRUE(all_ok(vs, nullptr)) << failures(vs);
    // The mutant without its fault is the kernel's arithmetic, bit for bit.
    const ClampedSwigluOutputs base = emu::clamped_swiglu_all(in, Fault::kMutantBaseline);
    EXPECT_TRUE(torch::equal(base.h, good.h));
    EXPECT_TRUE(torch::equal(base.grad_gate, good.grad_gate));
    EXPECT_TRUE(torch::equal(base.grad_up, good.grad_up));
    // fp32 outputs carry the error of the chain's fp32 roundings and expf's: a tolerance of a few
    // ulp of their own dtype at the tightest element (8.4 at grad_gate's); 16-bit outputs: 0.5-1.9.
    const double off = c.dtype == torch::kFloat ? 16 : 4;
    for (const char* name : {"h", "grad_gate", "grad_up"}) {
      EXPECT_LT(find(vs, name).tightest_ulps, off) << name;  // the nudges below must fail
    }
    auto check = [&](Fault f) { return check_clamped_swiglu(in, emu::clamped_swiglu_all(in, f)); };
    // The grid one thread short: the last pack of every output stays unwritten (NaN).
    auto bad = check(Fault::kLastPackSkipped);
    EXPECT_FALSE(find(bad, "h").ok());
    EXPECT_FALSE(find(bad, "grad_gate").ok() && find(bad, "grad_gate_outside").ok());
    EXPECT_FALSE(find(bad, "grad_up").ok() && find(bad, "grad_up_outside").ok());
    bad = check(Fault::kOperandsSwapped);
    for (const char* name : {"h", "grad_gate", "grad_up"}) EXPECT_FALSE(find(bad, name).ok());
    // The wrong clamp side: gate above the limit unclamped (h), its gradient let through there.
    bad = check(Fault::kGateClampedBelow);
    for (const char* name : {"h", "grad_gate_outside"}) EXPECT_FALSE(find(bad, name).ok()) << name;
    bad = check(Fault::kUpUnclamped);
    for (const char* name : {"h", "grad_up_outside"}) EXPECT_FALSE(find(bad, name).ok()) << name;
    expect_fails_exactly(check(Fault::kPlusOneDropped), {"h", "grad_gate"});
    expect_fails_exactly(check(Fault::kAlphaDropped), {"h", "grad_gate", "grad_up"});
    expect_fails_exactly(check(Fault::kGradientPassesOutside),
                         {"grad_gate_outside", "grad_up_outside"});
    expect_fails_exactly(check(Fault::kBoundsExcluded), {"grad_gate", "grad_up"});
    // One element `off` ulp off, where each tolerance is tightest; one gradient outside its clamp
    // not 0.
    const auto [inside_g, inside_u] = clamped_swiglu_inside(in);
    ClampedSwigluOutputs nudge = good;
    nudge.h = nudged(good.h, find(vs, "h").tightest, off);
    expect_fails_exactly(check_clamped_swiglu(in, nudge), {"h"});
    nudge = good;
    nudge.grad_gate =
        nudged(good.grad_gate, nth_true(inside_g, find(vs, "grad_gate").tightest), off);
    expect_fails_exactly(check_clamped_swiglu(in, nudge), {"grad_gate"});
    nudge = good;
    nudge.grad_up = nudged(good.grad_up, nth_true(inside_u, find(vs, "grad_up").tightest), off);
    expect_fails_exactly(check_clamped_swiglu(in, nudge), {"grad_up"});
    nudge = good;
    nudge.grad_gate = good.grad_gate.clone();
    nudge.grad_gate.view(-1)[nth_true(inside_g.logical_not(), 0)] = 1e-3;
    expect_fails_exactly(check_clamped_swiglu(in, nudge), {"grad_gate_outside"});
    nudge = good;
    nudge.grad_up = good.grad_up.clone();
    nudge.grad_up.view(-1)[nth_true(inside_u.logical_not(), 0)] = -1e-3;
    expect_fails_exactly(check_clamped_swiglu(in, nudge), {"grad_up_outside"});
  }
}

}  // namespace
}  // namespace moe::kernel_checks
