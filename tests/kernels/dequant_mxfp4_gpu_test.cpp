// The MXFP4 dequantization kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a
// device): the raw launch over the emulation's grid (poisoned output: an unwritten element fails)
// bit for bit against the ATen reference, on the device and on the CPU; and the dispatch
// (dequantize_mxfp4_into) taking the kernel on CUDA and the reference elsewhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dequant_mxfp4_checks.h"
#include "moe/kernels/dequant_mxfp4.h"
#include "moe/quant/mxfp4.h"

namespace moe::kernel_checks {
namespace {

class DequantMxfp4Gpu : public ::testing::TestWithParam<DequantMxfp4Case> {};
TEST_P(DequantMxfp4Gpu, MatchesTheReferenceBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  const auto& c = GetParam();
  const auto m_cpu = make_mxfp4(c);
  const auto m = m_cpu.to(cuda);
  const auto out = make_mxfp4_output(c, m.numel(), cuda);
  kernels::detail::dequantize_mxfp4_cuda(m.blocks, m.scales, out, /*poison=*/true);
  // ATen's ldexp is ::ldexp in fp32 on CUDA and std::ldexp in double on the CPU, each then one
  // cast to nearest even: both references must match.
  const Verdict on_device = check_dequant_mxfp4(m, out);
  EXPECT_TRUE(on_device.ok()) << on_device;
  const Verdict on_cpu = check_dequant_mxfp4(m_cpu, out.cpu());
  EXPECT_TRUE(on_cpu.ok()) << on_cpu;
  // The dispatch takes the kernel: the same bits, into a buffer of the stack's shape.
  ASSERT_TRUE(kernels::dequantize_mxfp4_supported(m.blocks, m.scales, out));
  auto sizes = c.shape;
  sizes.back() *= 32;
  const auto into = torch::full(sizes, NAN, out.options());
  kernels::dequantize_mxfp4_into(m.blocks, m.scales, into, /*fused=*/true);
  EXPECT_TRUE(torch::equal(into.reshape(-1), out));
}
INSTANTIATE_TEST_SUITE_P(Grid, DequantMxfp4Gpu, ::testing::ValuesIn(dequant_mxfp4_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(DequantMxfp4GpuDispatch, ReferenceWhereTheKernelDoesNotApply) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  const DequantMxfp4Case c{Mxfp4Data::kAllCodes, torch::kBFloat16, {256}};
  const auto m = make_mxfp4(c).to(cuda);
  const auto want = quant::dequantize_mxfp4(m.blocks, m.scales, torch::kBFloat16);
  // Not fused, or a non-contiguous output: the reference, copied in.
  auto out = torch::full({256 * 32}, NAN, want.options());
  kernels::dequantize_mxfp4_into(m.blocks, m.scales, out, /*fused=*/false);
  EXPECT_TRUE(torch::equal(out, want));
  const auto wide = torch::full({64, 128}, NAN, want.options()).t();
  EXPECT_FALSE(kernels::dequantize_mxfp4_supported(m.blocks, m.scales, wide));
  kernels::dequantize_mxfp4_into(m.blocks, m.scales, wide, /*fused=*/true);
  EXPECT_TRUE(torch::equal(wide.reshape(-1), want));
  // Non-contiguous blocks: the reference (which takes any strides).
  const auto strided = m.blocks.view({16, 16, 16}).transpose(0, 1);
  EXPECT_FALSE(kernels::dequantize_mxfp4_supported(strided, m.scales.view({16, 16}).t(), out));
  // A CPU output of CUDA blocks: not supported (the reference runs on the blocks' device).
  EXPECT_FALSE(kernels::dequantize_mxfp4_supported(m.blocks, m.scales,
                                                   torch::empty({256 * 32}, torch::kBFloat16)));
  // The raw launch names what it refuses.
  EXPECT_THROW(
      kernels::detail::dequantize_mxfp4_cuda(
          m.blocks, m.scales, torch::empty({256 * 32}, want.options().dtype(torch::kDouble))),
      c10::Error);
}

}  // namespace
}  // namespace moe::kernel_checks
