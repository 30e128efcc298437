// Which GPUs the default fatbin (cmake/MoeCuda.cmake) runs on, by CUDA's compatibility rules.
#include <gtest/gtest.h>

#include "moe/env/cuda_arch.h"

namespace {

using moe::env::cuda_arch_coverage;

constexpr const char* kDefault = "80-real;90-real;100-real;120";  // cmake/MoeCuda.cmake

TEST(CudaArch, TheDefaultFatbinCoversTheGpusUsersHave) {
  EXPECT_EQ(cuda_arch_coverage(kDefault, 8, 0).how, "SASS sm_80");    // A100
  EXPECT_EQ(cuda_arch_coverage(kDefault, 8, 6).how, "SASS sm_80");    // A10, RTX 30xx
  EXPECT_EQ(cuda_arch_coverage(kDefault, 8, 9).how, "SASS sm_80");    // L4, L40S, RTX 40xx
  EXPECT_EQ(cuda_arch_coverage(kDefault, 9, 0).how, "SASS sm_90");    // H100, H200
  EXPECT_EQ(cuda_arch_coverage(kDefault, 10, 0).how, "SASS sm_100");  // B200
  EXPECT_EQ(cuda_arch_coverage(kDefault, 12, 0).how, "SASS sm_120");  // RTX 50xx
  // A newer major runs the newest PTX through the driver's JIT.
  const auto future = cuda_arch_coverage(kDefault, 13, 0);
  EXPECT_TRUE(future.covered);
  EXPECT_EQ(future.how.rfind("PTX compute_120", 0), 0u) << future.how;
  // Older than every entry: not covered.
  EXPECT_FALSE(cuda_arch_coverage(kDefault, 7, 5).covered);
}

TEST(CudaArch, SassDoesNotCrossMajorVersionsAndArchSpecificCodeIsExact) {
  EXPECT_FALSE(cuda_arch_coverage("80-real", 9, 0).covered);    // no PTX: sm_80 SASS only
  EXPECT_TRUE(cuda_arch_coverage("80", 9, 0).covered);          // compute_80 PTX, JIT
  EXPECT_FALSE(cuda_arch_coverage("86-real", 8, 0).covered);    // SASS never runs on an older minor
  EXPECT_FALSE(cuda_arch_coverage("90a-real", 10, 0).covered);  // arch-specific
  EXPECT_EQ(cuda_arch_coverage("90a-real", 9, 0).how, "SASS sm_90a");
  EXPECT_EQ(cuda_arch_coverage("80;90", 9, 0).how, "SASS sm_90");  // native before JIT
  EXPECT_FALSE(cuda_arch_coverage("", 9, 0).covered);
  EXPECT_FALSE(cuda_arch_coverage("bogus;9", 9, 0).covered);
}

}  // namespace
