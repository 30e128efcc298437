#include "swiglu_emulation.h"

#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/swiglu.h"

namespace moe::kernel_emulation {

kernel_checks::SwigluOutputs swiglu_all(const kernel_checks::SwigluInputs& in, SwigluFault fault) {
  namespace k = kernels;
  const auto& gate = fault == SwigluFault::kOperandsSwapped ? in.up : in.gate;
  const auto& up = fault == SwigluFault::kOperandsSwapped ? in.gate : in.up;
  kernel_checks::SwigluOutputs out;
  // As the launcher: contiguous operands, fresh contiguous outputs poisoned like the GPU test's.
  out.h = torch::full_like(gate, NAN, torch::MemoryFormat::Contiguous);
  out.grad_gate = torch::full_like(gate, NAN, torch::MemoryFormat::Contiguous);
  out.grad_up = torch::full_like(up, NAN, torch::MemoryFormat::Contiguous);
  const auto fwd = k::detail::swiglu_shape(gate, up, {&out.h});
  const auto bwd = k::detail::swiglu_shape(gate, up, {&in.grad, &out.grad_gate, &out.grad_up});
  k::token_rows::with_row_dtype(gate.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPack = static_cast<int>(16 / sizeof(T));
    const T *g = gate.data_ptr<T>(), *u = up.data_ptr<T>(), *d = in.grad.data_ptr<T>();
    T *h = out.h.data_ptr<T>(), *dg = out.grad_gate.data_ptr<T>(), *du = out.grad_up.data_ptr<T>();
    const int64_t skip = fault == SwigluFault::kLastPackSkipped ? 1 : 0;
    for (int64_t i = 0; i < k::swiglu_rows::thread_count(fwd) - skip; ++i) {
      if (fwd.vec == kPack) {
        k::swiglu_rows::swiglu_forward_thread<kPack, T>(g, u, h, i);
      } else {
        k::swiglu_rows::swiglu_forward_thread<1, T>(g, u, h, i);
      }
    }
    for (int64_t i = 0; i < k::swiglu_rows::thread_count(bwd) - skip; ++i) {
      if (bwd.vec == kPack) {
        k::swiglu_rows::swiglu_backward_thread<kPack, T>(d, g, u, dg, du, i);
      } else {
        k::swiglu_rows::swiglu_backward_thread<1, T>(d, g, u, dg, du, i);
      }
    }
  });
  if (fault == SwigluFault::kDerivativeSigmoid) {  // T(T(dh * up) * sig)
    const auto ds = (in.grad.to(torch::kFloat) * in.up.to(torch::kFloat)).to(gate.scalar_type());
    out.grad_gate =
        (ds.to(torch::kFloat) * torch::sigmoid(in.gate.to(torch::kFloat))).to(gate.scalar_type());
  }
  return out;
}

}  // namespace moe::kernel_emulation
