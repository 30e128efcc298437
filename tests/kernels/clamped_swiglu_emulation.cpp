#include "clamped_swiglu_emulation.h"

#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/clamped_swiglu.h"

namespace moe::kernel_emulation {

namespace {

namespace rows = kernels::clamped_swiglu_rows;
using Fault = ClampedSwigluFault;

// The mutant: clamped_swiglu_pack.h's per-element arithmetic, step for step, with one fault
// switched in.
template <typename T>
void mutant_element(const rows::ClampedSwigluParams& p, Fault f, float x, float y, float dy, T* h,
                    T* d_gate, T* d_up) {
  using namespace kernels::rounding;
  const float b = p.bound;
  const float g = f == Fault::kGateClampedBelow ? (x < -b ? -b : x) : rows::clamp_max_f(x, b);
  const float u = f == Fault::kUpUnclamped ? y : rows::clamp_f(y, -b, b);
  const float alpha = f == Fault::kAlphaDropped ? 1.f : p.alpha;
  const float sig = rows::sigmoid_alpha<T>(g, alpha);
  const float glu = in_t<T>(mul_rn(g, sig));
  const float up1 = f == Fault::kPlusOneDropped ? u : in_t<T>(add_rn(u, 1.f));
  *h = static_cast<T>(mul_rn(up1, glu));
  const float d_up1 = mul_rn(dy, glu);
  const float d_glu = in_t<T>(mul_rn(dy, up1));
  const float d_g1 = in_t<T>(mul_rn(d_glu, sig));
  const float d_sig = in_t<T>(mul_rn(d_glu, g));
  const float d_a = in_t<T>(mul_rn(in_t<T>(mul_rn(d_sig, in_t<T>(sub_rn(1.f, sig)))), sig));
  const float d_g2 = in_t<T>(mul_rn(d_a, alpha));
  bool pass_g = f == Fault::kGateClampedBelow ? x >= -b : rows::passes_max(x, b);
  bool pass_u = f == Fault::kUpUnclamped || rows::passes(y, -b, b);
  if (f == Fault::kGradientPassesOutside) pass_g = pass_u = true;
  if (f == Fault::kBoundsExcluded) pass_g = x<b, pass_u = y> - b && y < b;
  *d_gate = pass_g ? static_cast<T>(add_rn(d_g1, d_g2)) : static_cast<T>(0.f);
  *d_up = pass_u ? static_cast<T>(d_up1) : static_cast<T>(0.f);
}

}  // namespace

kernel_checks::ClampedSwigluOutputs clamped_swiglu_all(const kernel_checks::ClampedSwigluInputs& in,
                                                       ClampedSwigluFault fault) {
  namespace k = kernels;
  const bool swap = fault == Fault::kOperandsSwapped;
  const auto& gate = swap ? in.up : in.gate;
  const auto& up = swap ? in.gate : in.up;
  kernel_checks::ClampedSwigluOutputs out;
  // As the launcher: contiguous operands, fresh contiguous outputs poisoned like the GPU test's.
  out.h = torch::full(in.gate.sizes(), NAN, in.gate.options());
  out.grad_gate = torch::full(in.gate.sizes(), NAN, in.gate.options());
  out.grad_up = torch::full(in.gate.sizes(), NAN, in.gate.options());
  const auto fwd = k::detail::clamped_swiglu_shape(gate, up, {&out.h});
  const auto bwd =
      k::detail::clamped_swiglu_shape(gate, up, {&in.grad, &out.grad_gate, &out.grad_up});
  k::token_rows::with_row_dtype(in.gate.scalar_type(), "clamped_swiglu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPack = static_cast<int>(16 / sizeof(T));
    const auto p = rows::clamped_swiglu_params<T>(in.limit, in.alpha);
    const T *g = gate.data_ptr<T>(), *u = up.data_ptr<T>(), *d = in.grad.data_ptr<T>();
    T *h = out.h.data_ptr<T>(), *dg = out.grad_gate.data_ptr<T>(), *du = out.grad_up.data_ptr<T>();
    if (fault != Fault::kNone && fault != Fault::kLastPackSkipped && !swap) {
      for (int64_t e = 0; e < fwd.n; ++e) {
        mutant_element<T>(p, fault, static_cast<float>(g[e]), static_cast<float>(u[e]),
                          static_cast<float>(d[e]), h + e, dg + e, du + e);
      }
      return;
    }
    const int64_t skip = fault == Fault::kLastPackSkipped ? 1 : 0;
    for (int64_t i = 0; i < rows::thread_count(fwd) - skip; ++i) {
      if (fwd.vec == kPack) {
        rows::clamped_swiglu_forward_thread<kPack, T>(p, g, u, h, i);
      } else {
        rows::clamped_swiglu_forward_thread<1, T>(p, g, u, h, i);
      }
    }
    for (int64_t i = 0; i < rows::thread_count(bwd) - skip; ++i) {
      if (bwd.vec == kPack) {
        rows::clamped_swiglu_backward_thread<kPack, T>(p, d, g, u, dg, du, i);
      } else {
        rows::clamped_swiglu_backward_thread<1, T>(p, d, g, u, dg, du, i);
      }
    }
  });
  return out;
}

}  // namespace moe::kernel_emulation
