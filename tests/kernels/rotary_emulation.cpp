#include "rotary_emulation.h"

#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/rotary.h"

namespace moe::kernel_emulation {

namespace {

// The rotation with one rounding at the end (wider intermediates): the arithmetic an fma would
// give the kernel, which the reference's two roundings must tell apart.
torch::Tensor rounded_once(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin, bool backward) {
  const auto w = x.to(torch::kDouble), c = cos.to(torch::kDouble), s = sin.to(torch::kDouble);
  const int64_t h = x.size(3) / 2;
  const auto x1 = w.narrow(3, 0, h), x2 = w.narrow(3, h, h);
  const auto c1 = c.narrow(-1, 0, h), c2 = c.narrow(-1, h, h);
  const auto s1 = s.narrow(-1, 0, h), s2 = s.narrow(-1, h, h);
  const auto out = backward ? torch::cat({x1 * c1 + x2 * s2, x2 * c2 - x1 * s1}, 3)
                            : torch::cat({x1 * c1 - x2 * s1, x2 * c2 + x1 * s2}, 3);
  auto result = kernels::detail::rotary_output(x);
  result.copy_(out.to(x.scalar_type()));
  return result;
}

}  // namespace

torch::Tensor rotary(const torch::Tensor& x_in, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool backward, RotaryFault fault) {
  // As the launcher: the last dimension contiguous, the output laid out as [B, S, N, hd].
  const auto x = x_in.stride(3) != 1 ? x_in.contiguous() : x_in;
  if (fault == RotaryFault::kFusedMultiplyAdd) return rounded_once(x, cos, sin, backward);
  auto out = kernels::detail::rotary_output(x);
  out.fill_(NAN);  // as the GPU test's poisoned output: an unwritten element fails the check
  const auto s = kernels::detail::rotary_shape(x, cos, sin, out);
  int64_t threads = kernels::rotary_rows::thread_count(s);
  if (fault == RotaryFault::kLastPackSkipped) --threads;
  kernels::token_rows::with_row_dtype(x.scalar_type(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPack = static_cast<int>(16 / sizeof(T));
    const T *xp = x.data_ptr<T>(), *cp = cos.data_ptr<T>(), *sp = sin.data_ptr<T>();
    T* op = out.data_ptr<T>();
    for (int64_t i = 0; i < threads; ++i) {
      if (s.vec == kPack) {
        kernels::rotary_rows::rotary_thread<kPack, T>(xp, cp, sp, op, s, i, backward);
      } else {
        kernels::rotary_rows::rotary_thread<1, T>(xp, cp, sp, op, s, i, backward);
      }
    }
  });
  return out;
}

kernel_checks::RotaryOutputs rotary_all(const kernel_checks::RotaryInputs& in, RotaryFault fault) {
  return {rotary(in.x, in.cos, in.sin, /*backward=*/false, fault),
          rotary(in.grad, in.cos, in.sin, /*backward=*/true, fault)};
}

}  // namespace moe::kernel_emulation
