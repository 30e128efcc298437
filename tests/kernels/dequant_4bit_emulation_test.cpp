// The 4-bit dequantization's GPU check (dequant_4bit_checks.h) run on the CPU with the kernel's
// emulation (dequant_4bit_emulation.h) over the GPU test's grid, the launch shape the launcher
// picks, and mutation cases that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dequant_4bit_checks.h"
#include "dequant_4bit_emulation.h"
#include "moe/kernels/dequant_4bit.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
namespace dq = ::moe::kernels::dequant_4bit_rows;
const torch::Device kCpu(torch::kCPU);
using quant::Quant4bitType;

class Dequant4bitEmulation : public ::testing::TestWithParam<Dequant4bitCase> {};
TEST_P(Dequant4bitEmulation, MatchesTheReferenceBitForBit) {
  const auto& c = GetParam();
  const auto q = make_quantized(c);
  const auto out = make_dequant_output(c, q.numel(), kCpu);
  emu::dequantize_4bit(q, out);
  const Verdict v = check_dequant_4bit(q, out);
  EXPECT_TRUE(v.ok()) << v;
}
INSTANTIATE_TEST_SUITE_P(Grid, Dequant4bitEmulation, ::testing::ValuesIn(dequant_4bit_cases()),
                         [](const auto& i) { return case_name(i.param); });

dq::Dequant4bitShape shape_of(const Dequant4bitCase& c) {
  const auto q = make_quantized(c);
  return kernels::detail::dequantize_4bit_shape(q, make_dequant_output(c, q.numel(), kCpu));
}

TEST(Dequant4bitShape, SixteenBytePacksWhereTheOutputAllowsElseOneByte) {
  const auto nf4 = Quant4bitType::kNf4;
  EXPECT_EQ(shape_of({nf4, false, torch::kBFloat16, {768, 2048}}).vec, 8);
  EXPECT_EQ(shape_of({nf4, true, torch::kHalf, {768, 2048}}).vec, 8);
  EXPECT_EQ(shape_of({nf4, false, torch::kFloat, {5, 100}}).vec, 4);     // 500 = 125 x 4
  EXPECT_EQ(shape_of({nf4, false, torch::kBFloat16, {5, 100}}).vec, 2);  // 500 not x 8
  EXPECT_EQ(shape_of({nf4, false, torch::kFloat, {64, 64}, true}).vec, 2);
  const auto s = shape_of({nf4, true, torch::kFloat, {33, 65}});
  EXPECT_EQ(s.vec, 2);
  EXPECT_EQ(s.n, 33 * 65);
  EXPECT_TRUE(s.double_quant);
  EXPECT_EQ(dq::thread_count(s), (33 * 65 + 1) / 2);  // the last thread writes one value
}

TEST(Dequant4bitShape, BadArgumentsAreNamed) {
  const Dequant4bitCase c{Quant4bitType::kFp4, true, torch::kFloat, {7, 9}};
  const auto q = make_quantized(c);
  const auto out = make_dequant_output(c, q.numel(), kCpu);
  auto shape = [&](const quant::Quantized4bit& qq, const torch::Tensor& o) {
    return kernels::detail::dequantize_4bit_shape(qq, o);
  };
  EXPECT_NO_THROW(shape(q, out));
  EXPECT_THROW(shape(q, out.to(torch::kDouble)), c10::Error);
  EXPECT_THROW(shape(q, out.narrow(0, 0, 62)), c10::Error);
  EXPECT_THROW(shape(q, torch::zeros({126})), c10::Error);
  EXPECT_THROW(shape(q, torch::zeros({9, 7}).t()), c10::Error);  // not contiguous
  auto bad = q;
  bad.codes = q.codes.to(torch::kInt);
  EXPECT_THROW(shape(bad, out), c10::Error);
  bad = q;
  bad.absmax = q.absmax.to(torch::kFloat);  // double quant keeps uint8 indices
  EXPECT_THROW(shape(bad, out), c10::Error);
  bad = q;
  bad.offset = torch::Tensor();
  EXPECT_THROW(shape(bad, out), c10::Error);
  bad = q;
  bad.blocksize = 63;
  EXPECT_THROW(shape(bad, out), c10::Error);
  // On the CPU the dispatch takes the reference, whatever it asks for.
  EXPECT_FALSE(kernels::dequantize_4bit_supported(q, out));
  const auto into = torch::empty({7, 9});
  kernels::dequantize_4bit_into(q, into, /*fused=*/true);
  EXPECT_TRUE(torch::equal(into, quant::dequantize_4bit(q)));
}

// ---- mutations: the bitwise comparison catches each fault ------------------------------------

TEST(KernelCheckMutations, Dequant4bitFaultsFail) {
  using F = emu::Dequant4bitFault;
  for (const Dequant4bitCase& c :
       {Dequant4bitCase{Quant4bitType::kNf4, true, torch::kBFloat16, {768, 2048}},
        Dequant4bitCase{Quant4bitType::kFp4, true, torch::kFloat, {4 * 352, 704}},
        Dequant4bitCase{Quant4bitType::kNf4, true, torch::kHalf, {33, 65}},
        Dequant4bitCase{Quant4bitType::kFp4, false, torch::kBFloat16, {64, 64}, true}}) {
    SCOPED_TRACE(case_name(c));
    const auto q = make_quantized(c);
    auto run = [&](F fault) {
      const auto out = make_dequant_output(c, q.numel(), kCpu);
      emu::dequantize_4bit(q, out, fault);
      return check_dequant_4bit(q, out);
    };
    ASSERT_TRUE(run(F::kNone).ok()) << run(F::kNone);
    EXPECT_FALSE(run(F::kLastThreadSkipped).ok());
    EXPECT_FALSE(run(F::kNibblesSwapped).ok());
    EXPECT_FALSE(run(F::kBlockFromByteIndex).ok());
    // The fma moves an absmax by an fp32 ulp in some blocks: visible in fp32 outputs; a 16-bit
    // cast hides it but for a value on a rounding boundary.
    if (c.double_quant && c.dtype == torch::kFloat && q.blocks() > 64) {
      EXPECT_FALSE(run(F::kAbsmaxFma).ok());
    }
    if (c.double_quant && q.nested_absmax.numel() > 1) {
      EXPECT_FALSE(run(F::kNestedIndexWrong).ok());
    }
    if (c.dtype == torch::kBFloat16) {
      EXPECT_FALSE(run(F::kBf16Truncated).ok());
    }
    // One element one ulp off, and a +0 written as -0: both differ in bits.
    auto out = make_dequant_output(c, q.numel(), kCpu);
    emu::dequantize_4bit(q, out);
    EXPECT_FALSE(check_dequant_4bit(q, nudged(out, q.numel() / 2, 1)).ok());
    const auto zero = (out == 0).nonzero();
    if (zero.numel() > 0) {
      auto neg = out.clone();
      neg[zero[0][0].item<int64_t>()] = -0.0;
      if (!torch::equal(neg.view(torch::kByte), out.view(torch::kByte))) {
        EXPECT_FALSE(check_dequant_4bit(q, neg).ok());
      }
    }
  }
}

}  // namespace
}  // namespace moe::kernel_checks
