// The 4-bit dequantization kernel on a GPU (label `gpu`, in moe_gpu_tests; skipped without a
// device): the raw launch over the emulation's grid (poisoned output: an unwritten element fails)
// bit for bit against the ATen reference, on the device and on the CPU; and the dispatch
// (dequantize_4bit_into) taking the kernel on CUDA and the reference elsewhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dequant_4bit_checks.h"
#include "moe/kernels/dequant_4bit.h"

namespace moe::kernel_checks {
namespace {

class Dequant4bitGpu : public ::testing::TestWithParam<Dequant4bitCase> {};
TEST_P(Dequant4bitGpu, MatchesTheReferenceBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  const auto& c = GetParam();
  const auto q_cpu = make_quantized(c);
  const auto q = q_cpu.to(cuda);
  const auto out = make_dequant_output(c, q.numel(), cuda);
  kernels::detail::dequantize_4bit_cuda(q, out, /*poison=*/true);
  // ATen's CUDA ops and its CPU ops round alike here (products, a sum, casts to nearest even):
  // both references must match.
  const Verdict on_device = check_dequant_4bit(q, out);
  EXPECT_TRUE(on_device.ok()) << on_device;
  const Verdict on_cpu = check_dequant_4bit(q_cpu, out.cpu());
  EXPECT_TRUE(on_cpu.ok()) << on_cpu;
  // The dispatch takes the kernel: the same bits, into a matrix-shaped buffer.
  ASSERT_TRUE(kernels::dequantize_4bit_supported(q, out));
  const auto into = torch::full(c.shape, NAN, out.options());
  kernels::dequantize_4bit_into(q, into, /*fused=*/true);
  EXPECT_TRUE(torch::equal(into.reshape(-1), out));
}
INSTANTIATE_TEST_SUITE_P(Grid, Dequant4bitGpu, ::testing::ValuesIn(dequant_4bit_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(Dequant4bitGpuDispatch, ReferenceWhereTheKernelDoesNotApply) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  const Dequant4bitCase c{quant::Quant4bitType::kNf4, true, torch::kBFloat16, {33, 65}};
  const auto q = make_quantized(c).to(cuda);
  const auto want = quant::dequantize_4bit(q, torch::kBFloat16);
  // Not fused, or a non-contiguous output: the reference, copied in.
  auto out = torch::full(c.shape, NAN, want.options());
  kernels::dequantize_4bit_into(q, out, /*fused=*/false);
  EXPECT_TRUE(torch::equal(out, want));
  const auto wide = torch::full({65, 33}, NAN, want.options()).t();
  EXPECT_FALSE(kernels::dequantize_4bit_supported(q, wide));
  // A CPU output of a CUDA state: not supported (the reference runs on the state's device).
  EXPECT_FALSE(kernels::dequantize_4bit_supported(q, torch::empty({33 * 65}, torch::kBFloat16)));
  // The raw launch names what it refuses.
  EXPECT_THROW(kernels::detail::dequantize_4bit_cuda(
                   q, torch::empty({33 * 65}, want.options().dtype(torch::kDouble))),
               c10::Error);
}

}  // namespace
}  // namespace moe::kernel_checks
