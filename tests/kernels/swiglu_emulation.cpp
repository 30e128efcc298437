#include "swiglu_emulation.h"

#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/swiglu.h"

namespace moe::kernel_emulation {

using kernels::swiglu_rows::Gate;

kernel_checks::SwigluOutputs swiglu_all(const kernel_checks::SwigluInputs& in, SwigluFault fault) {
  namespace k = kernels;
  const bool swap = fault == SwigluFault::kOperandsSwapped;
  const bool packed = in.gate_up.defined();
  const auto& gate = swap ? in.up : in.gate;
  const auto& up = swap ? in.gate : in.up;
  kernel_checks::SwigluOutputs out;
  // As the launcher: contiguous operands, fresh contiguous outputs poisoned like the GPU test's.
  out.h = torch::full(in.gate.sizes(), NAN, in.gate.options());
  torch::Tensor d_gate_up;  // packed: the one gradient whose halves are grad_gate and grad_up
  k::swiglu_rows::SwigluShape fwd, bwd;
  if (packed) {
    d_gate_up = torch::full_like(in.gate_up, NAN, torch::MemoryFormat::Contiguous);
    out.grad_gate = d_gate_up.narrow(-1, 0, in.gate.size(-1));
    out.grad_up = d_gate_up.narrow(-1, in.gate.size(-1), in.gate.size(-1));
    fwd = k::detail::swiglu_packed_shape(in.gate_up, {&out.h});
    bwd = k::detail::swiglu_packed_shape(in.gate_up, {&in.grad}, {&d_gate_up});
  } else {
    out.grad_gate = torch::full_like(gate, NAN, torch::MemoryFormat::Contiguous);
    out.grad_up = torch::full_like(up, NAN, torch::MemoryFormat::Contiguous);
    fwd = k::detail::swiglu_shape(gate, up, {&out.h});
    bwd = k::detail::swiglu_shape(gate, up, {&in.grad, &out.grad_gate, &out.grad_up});
  }
  if (fault == SwigluFault::kRowStrideIgnored) fwd.stride = fwd.cols, bwd.stride = bwd.cols;
  k::token_rows::with_row_dtype(in.gate.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPack = static_cast<int>(16 / sizeof(T));
    // As the launcher: packed, gate and up (and their gradients) start `cols` elements apart.
    const T *g, *u;
    T *dg, *du;
    if (packed) {
      const T* base = in.gate_up.data_ptr<T>();
      g = swap ? base + fwd.cols : base;
      u = swap ? base : base + fwd.cols;
      dg = d_gate_up.data_ptr<T>();
      du = dg + bwd.cols;
    } else {
      g = gate.data_ptr<T>(), u = up.data_ptr<T>();
      dg = out.grad_gate.data_ptr<T>(), du = out.grad_up.data_ptr<T>();
    }
    const T* d = in.grad.data_ptr<T>();
    T* h = out.h.data_ptr<T>();
    const int64_t skip = fault == SwigluFault::kLastPackSkipped ? 1 : 0;
    auto run = [&](auto gv) {
      constexpr auto G = decltype(gv)::value;
      for (int64_t i = 0; i < k::swiglu_rows::thread_count(fwd) - skip; ++i) {
        if (fwd.vec == kPack) {
          k::swiglu_rows::swiglu_forward_thread<kPack, T, G>(fwd, g, u, h, i);
        } else {
          k::swiglu_rows::swiglu_forward_thread<1, T, G>(fwd, g, u, h, i);
        }
      }
      for (int64_t i = 0; i < k::swiglu_rows::thread_count(bwd) - skip; ++i) {
        if (bwd.vec == kPack) {
          k::swiglu_rows::swiglu_backward_thread<kPack, T, G>(bwd, d, g, u, dg, du, i);
        } else {
          k::swiglu_rows::swiglu_backward_thread<1, T, G>(bwd, d, g, u, dg, du, i);
        }
      }
    };
    if (in.gate_fn == Gate::kGeluTanh) {
      run(std::integral_constant<Gate, Gate::kGeluTanh>{});
    } else {
      run(std::integral_constant<Gate, Gate::kSilu>{});
    }
  });
  if (fault == SwigluFault::kDerivativePartDropped) {  // T(T(dh * up) * sig), or 0.5 (1 + t)
    const auto ds = (in.grad.to(torch::kFloat) * in.up.to(torch::kFloat)).to(gate.scalar_type());
    const auto x = in.gate.to(torch::kFloat);
    const auto part = in.gate_fn == Gate::kGeluTanh
                          ? 0.5 * (1 + torch::tanh(k::swiglu_rows::kGeluBeta *
                                                   (x + k::swiglu_rows::kGeluKappa * x * x * x)))
                          : torch::sigmoid(x);
    out.grad_gate = (ds.to(torch::kFloat) * part).to(gate.scalar_type());
  }
  return out;
}

}  // namespace moe::kernel_emulation
