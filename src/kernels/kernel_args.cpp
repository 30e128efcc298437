// Host-side argument checks of the CUDA kernels (kernel_args.h): index ranges and grid limits,
// switched on in debug builds, by MOE_KERNEL_ARG_CHECKS=1 or by set_argument_checks().
#include "moe/kernels/kernel_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace moe::kernels {
namespace {

bool default_checks() {
#ifndef NDEBUG
  return true;
#else
  const char* v = std::getenv("MOE_KERNEL_ARG_CHECKS");
  return v != nullptr && std::strcmp(v, "1") == 0;
#endif
}

std::atomic<bool>& checks_flag() {
  static std::atomic<bool> flag{default_checks()};
  return flag;
}

}  // namespace

void set_argument_checks(bool enabled) { checks_flag().store(enabled); }
bool argument_checks() { return checks_flag().load(); }

void check_values_in_range(const at::Tensor& values, int64_t lo, int64_t hi, const char* what) {
  if (!values.defined() || values.numel() == 0) return;
  const auto flat = values.reshape(-1);
  const auto bad = (flat < lo).logical_or_(flat >= hi);
  if (!bad.any().item<bool>()) return;
  const int64_t at = bad.nonzero()[0][0].item<int64_t>();
  const int64_t value = flat[at].item<int64_t>();
  TORCH_CHECK(false, "moe kernels: ", what, " holds ", value, " at position ", at, " of ",
              flat.numel(), "; expected values in [", lo, ", ", hi, ")");
}

void check_grid(int64_t blocks, int64_t items, const char* kernel) {
  TORCH_CHECK(blocks >= 0 && blocks <= INT32_MAX, "moe kernels: ", kernel, " over ", items,
              " items needs ", blocks, " blocks; the grid limit is ", INT32_MAX);
}

}  // namespace moe::kernels
