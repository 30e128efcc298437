// The MXFP4 dequantization's GPU check (dequant_mxfp4_checks.h) run on the CPU with the kernel's
// emulation (dequant_mxfp4_emulation.h) over the GPU test's grid, the launch shape the launcher
// picks, the edge values worked out by hand (every scale byte's fp32 / bf16 / fp16 extremes, fp16
// overflow, underflow and its subnormals' ties to even), and mutation cases that must fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "dequant_mxfp4_checks.h"
#include "dequant_mxfp4_emulation.h"
#include "moe/kernels/dequant_mxfp4.h"
#include "moe/quant/mxfp4.h"

namespace moe::kernel_checks {
namespace {

namespace emu = ::moe::kernel_emulation;
namespace dq = ::moe::kernels::dequant_mxfp4_rows;
const torch::Device kCpu(torch::kCPU);
using D = Mxfp4Data;

class DequantMxfp4Emulation : public ::testing::TestWithParam<DequantMxfp4Case> {};
TEST_P(DequantMxfp4Emulation, MatchesTheReferenceBitForBit) {
  const auto& c = GetParam();
  const auto m = make_mxfp4(c);
  const auto out = make_mxfp4_output(c, m.numel(), kCpu);
  emu::dequantize_mxfp4(m, out);
  const Verdict v = check_dequant_mxfp4(m, out);
  EXPECT_TRUE(v.ok()) << v;
}
INSTANTIATE_TEST_SUITE_P(Grid, DequantMxfp4Emulation, ::testing::ValuesIn(dequant_mxfp4_cases()),
                         [](const auto& i) { return case_name(i.param); });

dq::DequantMxfp4Shape shape_of(const DequantMxfp4Case& c) {
  const auto m = make_mxfp4(c);
  return kernels::detail::dequantize_mxfp4_shape(m.blocks, m.scales,
                                                 make_mxfp4_output(c, m.numel(), kCpu));
}

TEST(DequantMxfp4Shape, SixteenBytePacksWhereTheOutputAllowsElseOneByte) {
  EXPECT_EQ(shape_of({D::kWeights, torch::kBFloat16, {4, 64, 90}}).vec, 8);
  EXPECT_EQ(shape_of({D::kRandom, torch::kHalf, {1}}).vec, 8);
  EXPECT_EQ(shape_of({D::kRandom, torch::kFloat, {7, 33}}).vec, 4);
  EXPECT_EQ(shape_of({D::kRandom, torch::kFloat, {7, 33}, true}).vec, 2);
  const auto s = shape_of({D::kAllCodes, torch::kHalf, {256}, true});
  EXPECT_EQ(s.vec, 2);
  EXPECT_EQ(s.n, 256 * 32);
  EXPECT_EQ(dq::thread_count(s), 256 * 16);  // a byte a thread
  // Blocks one byte past an allocation: their pack can't be one load.
  const auto m = make_mxfp4({D::kRandom, torch::kFloat, {7, 33}});
  const auto odd =
      torch::empty({m.blocks.numel() + 1}, torch::kUInt8).narrow(0, 1, m.blocks.numel());
  odd.copy_(m.blocks.reshape(-1));
  const auto out = torch::empty({m.numel()});
  EXPECT_EQ(kernels::detail::dequantize_mxfp4_shape(odd.view(m.blocks.sizes()), m.scales, out).vec,
            2);
  EXPECT_EQ(kernels::detail::dequantize_mxfp4_shape(m.blocks, m.scales, out).vec, 4);
}

TEST(DequantMxfp4Shape, BadArgumentsAreNamed) {
  const DequantMxfp4Case c{D::kRandom, torch::kFloat, {7, 33}};
  const auto m = make_mxfp4(c);
  const auto out = make_mxfp4_output(c, m.numel(), kCpu);
  auto shape = [&](const torch::Tensor& blocks, const torch::Tensor& scales,
                   const torch::Tensor& o) {
    return kernels::detail::dequantize_mxfp4_shape(blocks, scales, o);
  };
  EXPECT_NO_THROW(shape(m.blocks, m.scales, out));
  EXPECT_THROW(shape(m.blocks, m.scales, out.to(torch::kDouble)), c10::Error);
  EXPECT_THROW(shape(m.blocks, m.scales, out.narrow(0, 0, m.numel() - 32)), c10::Error);
  EXPECT_THROW(shape(m.blocks, m.scales, torch::zeros({33 * 32, 7}).t()), c10::Error);
  EXPECT_THROW(shape(m.blocks.to(torch::kInt), m.scales, out), c10::Error);
  EXPECT_THROW(shape(m.blocks, m.scales.to(torch::kInt), out), c10::Error);
  EXPECT_THROW(shape(m.blocks, m.scales.t().contiguous(), out), c10::Error);  // [33, 7]
  EXPECT_THROW(shape(m.blocks.view({7, 66, 8}), m.scales, out), c10::Error);
  EXPECT_THROW(shape(m.blocks.transpose(0, 1).contiguous().transpose(0, 1), m.scales, out),
               c10::Error);  // not contiguous
  EXPECT_THROW(shape(torch::Tensor(), m.scales, out), c10::Error);
  // On the CPU the dispatch takes the reference, whatever it asks for, into any shape of n values.
  EXPECT_FALSE(kernels::dequantize_mxfp4_supported(m.blocks, m.scales, out));
  const auto into = torch::empty({7, 33 * 32}, torch::kBFloat16);
  kernels::dequantize_mxfp4_into(m.blocks, m.scales, into, /*fused=*/true);
  EXPECT_TRUE(torch::equal(into, quant::dequantize_mxfp4(m.blocks, m.scales, torch::kBFloat16)));
  EXPECT_THROW(kernels::dequantize_mxfp4_into(m.blocks, m.scales, torch::empty({7, 33}), true),
               c10::Error);
}

// ---- edges worked out by hand -------------------------------------------------------------

// One block whose 32 values are all (code, scale): the reference's and the emulation's value.
struct Edge {
  int code, scale;
  uint32_t fp32;        // bits
  uint16_t bf16, fp16;  // bits
};
template <typename Bits>
Bits bits_of(const torch::Tensor& t) {
  Bits b;
  std::memcpy(&b, t.data_ptr(), sizeof(b));
  return b;
}

TEST(DequantMxfp4Numerics, EdgesAsWorkedOutByHand) {
  // value = e2m1[code] x 2^(scale - 127), exact, then rounded once to the dtype. fp16: subnormals
  // are multiples of 2^-24 (ties to the even multiple), 65520 and above overflow to inf.
  const std::vector<Edge> edges = {
      {0, 127, 0x00000000, 0x0000, 0x0000},   // +0
      {8, 127, 0x80000000, 0x8000, 0x8000},   // -0
      {7, 127, 0x40C00000, 0x40C0, 0x4600},   // 6
      {15, 130, 0xC2400000, 0xC240, 0xD200},  // -6 x 8 = -48
      {0, 255, 0x00000000, 0x0000, 0x0000},   // 0 x 2^128 = 0 (ldexp; not 0 x inf = NaN)
      {8, 255, 0x80000000, 0x8000, 0x8000},   // -0 x 2^128 = -0
      {1, 255, 0x7F000000, 0x7F00, 0x7C00},   // 0.5 x 2^128 = 2^127 (fp16: inf)
      {2, 255, 0x7F800000, 0x7F80, 0x7C00},   // 2^128: inf
      {15, 255, 0xFF800000, 0xFF80, 0xFC00},  // -6 x 2^128: -inf
      {3, 254, 0x7F400000, 0x7F40, 0x7C00},   // 1.5 x 2^127, fp32's largest power times 1.5
      {4, 254, 0x7F800000, 0x7F80, 0x7C00},   // 2 x 2^127: inf
      {1, 0, 0x00200000, 0x0020, 0x0000},     // 0.5 x 2^-127 = 2^-128, a subnormal
      {3, 0, 0x00600000, 0x0060, 0x0000},     // 1.5 x 2^-127 = 3 x 2^-128, a subnormal
      {7, 0, 0x01400000, 0x0140, 0x0000},     // 6 x 2^-127 = 1.5 x 2^-125, normal
      {10, 1, 0x80800000, 0x8080, 0x8000},    // -1 x 2^-126: fp32's smallest normal
      {7, 141, 0x47C00000, 0x47C0, 0x7C00},   // 6 x 2^14 = 98304: fp16 inf
      {5, 141, 0x47400000, 0x4740, 0x7A00},   // 3 x 2^14 = 49152
      {4, 142, 0x47800000, 0x4780, 0x7C00},   // 2 x 2^15 = 65536: fp16 inf
      {14, 142, 0xC8000000, 0xC800, 0xFC00},  // -4 x 2^15 = -131072: fp16 -inf
      {2, 113, 0x38800000, 0x3880, 0x0400},   // 2^-14: fp16's smallest normal
      {1, 104, 0x33800000, 0x3380, 0x0001},   // 0.5 x 2^-23 = 2^-24: fp16's smallest subnormal
      {3, 104, 0x34400000, 0x3440, 0x0003},   // 1.5 x 2^-23 = 3 x 2^-24
      {1, 103, 0x33000000, 0x3300, 0x0000},   // 2^-25: a tie, to the even 0
      {9, 103, 0xB3000000, 0xB300, 0x8000},   // -2^-25: to -0
      {3, 103, 0x33C00000, 0x33C0, 0x0002},   // 1.5 x 2^-24: a tie, to the even 2 x 2^-24
      {11, 103, 0xB3C00000, 0xB3C0, 0x8002},  // -1.5 x 2^-24: -2 x 2^-24
      {5, 102, 0x33C00000, 0x33C0, 0x0002},   // 3 x 2^-25 = 1.5 x 2^-24: to 2 x 2^-24
      {7, 100, 0x33400000, 0x3340, 0x0001},   // 6 x 2^-27 = 0.75 x 2^-24: up to 2^-24
      {6, 100, 0x33000000, 0x3300, 0x0000},   // 4 x 2^-27 = 2^-25: a tie, to 0
      {7, 102, 0x34400000, 0x3440, 0x0003},   // 6 x 2^-25 = 3 x 2^-24
      {5, 101, 0x33400000, 0x3340, 0x0001},   // 3 x 2^-26 = 0.75 x 2^-24: up
  };
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
  for (const Edge& e : edges) {
    SCOPED_TRACE("code " + std::to_string(e.code) + ", scale " + std::to_string(e.scale));
    Mxfp4Tensors m{torch::full({1, 16}, e.code | (e.code << 4), u8), torch::full({1}, e.scale, u8)};
    for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      SCOPED_TRACE(c10::toString(dt));
      const auto want_bits = dt == torch::kFloat      ? e.fp32
                             : dt == torch::kBFloat16 ? e.bf16
                                                      : e.fp16;
      const auto ref = quant::dequantize_mxfp4(m.blocks, m.scales, dt).reshape(-1);
      const auto out = torch::full({32}, NAN, torch::TensorOptions().dtype(dt));
      emu::dequantize_mxfp4(m, out);
      for (const auto& t : {ref, out}) {
        for (int64_t i = 0; i < 32; ++i) {
          const auto v = t[i];
          const uint32_t got = dt == torch::kFloat ? bits_of<uint32_t>(v.contiguous())
                                                   : bits_of<uint16_t>(v.contiguous());
          ASSERT_EQ(got, want_bits) << (t.data_ptr() == ref.data_ptr() ? "reference" : "emulation")
                                    << " value " << i << ": " << v.item<double>();
        }
      }
    }
  }
}

// ---- mutations: the bitwise comparison catches each fault ------------------------------------

TEST(KernelCheckMutations, DequantMxfp4FaultsFail) {
  using F = emu::DequantMxfp4Fault;
  for (const DequantMxfp4Case& c : {DequantMxfp4Case{D::kAllCodes, torch::kFloat, {256}},
                                    DequantMxfp4Case{D::kAllCodes, torch::kBFloat16, {256}, true},
                                    DequantMxfp4Case{D::kAllCodes, torch::kHalf, {256}},
                                    DequantMxfp4Case{D::kWeights, torch::kBFloat16, {4, 64, 90}},
                                    DequantMxfp4Case{D::kRandom, torch::kHalf, {7, 33}, true}}) {
    SCOPED_TRACE(case_name(c));
    const auto m = make_mxfp4(c);
    auto run = [&](F fault) {
      const auto out = make_mxfp4_output(c, m.numel(), kCpu);
      emu::dequantize_mxfp4(m, out, fault);
      return check_dequant_mxfp4(m, out);
    };
    ASSERT_TRUE(run(F::kNone).ok()) << run(F::kNone);
    EXPECT_FALSE(run(F::kLastThreadSkipped).ok());
    EXPECT_FALSE(run(F::kHighNibbleFirst).ok());
    EXPECT_FALSE(run(F::kScaleOffByOne).ok());
    EXPECT_FALSE(run(F::kBlockFromByteIndex).ok());
    if (c.data == D::kAllCodes) {  // every scale byte: 255 and the subnormal powers are there
      EXPECT_FALSE(run(F::kScale255Infinite).ok());
      if (c.dtype != torch::kHalf) {
        EXPECT_FALSE(run(F::kSubnormalScaleZero).ok());
      }
    }
    if (c.dtype == torch::kHalf) {
      EXPECT_FALSE(run(F::kHalfSubnormalsFlushed).ok());
      EXPECT_FALSE(run(F::kHalfTiesAway).ok());
      EXPECT_FALSE(run(F::kHalfSaturated).ok());
    }
    // One element one ulp off, and a +0 written as -0: both differ in bits.
    auto out = make_mxfp4_output(c, m.numel(), kCpu);
    emu::dequantize_mxfp4(m, out);
    const auto finite = (out.isfinite() & (out != 0)).nonzero();
    ASSERT_GT(finite.numel(), 0);
    EXPECT_FALSE(check_dequant_mxfp4(m, nudged(out, finite[0][0].item<int64_t>(), 1)).ok());
    const auto zero = (out == 0).nonzero();
    ASSERT_GT(zero.numel(), 0);
    auto neg = out.clone();
    const int64_t z = zero[0][0].item<int64_t>();
    neg[z] = -out[z];
    EXPECT_FALSE(check_dequant_mxfp4(m, neg).ok());
  }
}

}  // namespace
}  // namespace moe::kernel_checks
