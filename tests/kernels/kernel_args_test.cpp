// The kernels' host-side argument checks (src/kernels/kernel_args.cpp), on CPU tensors: the same
// code runs before the CUDA launches when argument checks are on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <string>

#include "moe/kernels/kernel_args.h"

namespace moe::kernels {
namespace {

TEST(KernelArgs, OutOfRangeValuesAndGridLimitsAreNamed) {
  auto ids = torch::tensor({0, 3, -1, 2}, torch::kLong);
  try {
    check_values_in_range(ids, 0, 3, "topk_idx (expert ids)");
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("topk_idx (expert ids) holds 3 at position 1 of 4; expected values in [0, 3)"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(check_values_in_range(ids, -1, 4, "rows"));
  EXPECT_NO_THROW(check_values_in_range(torch::empty({0}, torch::kLong), 0, 1, "none"));
  try {
    check_grid(int64_t{1} << 31, int64_t{1} << 40, "permute_backward");
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_NE(m.find("permute_backward over 1099511627776 items needs 2147483648 blocks"),
              std::string::npos)
        << m;
  }
  EXPECT_NO_THROW(check_grid(std::numeric_limits<int32_t>::max(), 1, "ok"));
  const bool was = argument_checks();
  set_argument_checks(!was);
  EXPECT_EQ(argument_checks(), !was);
  set_argument_checks(was);
}

}  // namespace
}  // namespace moe::kernels
