// gpt-oss's clamped SwiGLU: the ATen reference, the choice between it and the fused op, the
// fused op's autograd wrapper around the raw launches of src/kernels/clamped_swiglu.cu, and the
// launch shape both the launcher and the CPU emulation use. In a CPU-only build the op reports
// that the kernels are absent; the experts never select it there.
#include <torch/torch.h>

#include "moe/kernels/clamped_swiglu.h"
#include "moe/kernels/permute.h"  // cuda_kernels_compiled

namespace moe::kernels {

namespace {

bool kernel_dtype(at::ScalarType dt) {
  return dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16;
}

}  // namespace

namespace detail {

clamped_swiglu_rows::ClampedSwigluShape clamped_swiglu_shape(
    const at::Tensor& gate, const at::Tensor& up, std::initializer_list<const at::Tensor*> others) {
  const auto dt = gate.scalar_type();
  TORCH_CHECK(kernel_dtype(dt),
              "moe kernels: clamped_swiglu: gate must be fp32, fp16 or bf16, got ", dt);
  bool aligned = true;
  auto check = [&](const at::Tensor& t) {
    TORCH_CHECK(t.sizes() == gate.sizes() && t.scalar_type() == dt,
                "moe kernels: clamped_swiglu: an operand of ", t.sizes(), " ", t.scalar_type(),
                " for gate ", gate.sizes(), " ", dt);
    TORCH_CHECK(t.is_contiguous(), "moe kernels: clamped_swiglu: operands must be contiguous");
    aligned = aligned && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  check(gate);
  check(up);
  for (const at::Tensor* t : others) check(*t);
  clamped_swiglu_rows::ClampedSwigluShape s;
  s.n = gate.numel();
  const int pack = static_cast<int>(16 / gate.element_size());
  s.vec = aligned && s.n % pack == 0 ? pack : 1;
  return s;
}

}  // namespace detail

at::Tensor clamped_swiglu_reference(const at::Tensor& gate, const at::Tensor& up, double limit,
                                    double alpha) {
  const auto g = gate.clamp_max(limit);
  const auto u = up.clamp(-limit, limit);
  const auto glu = g * torch::sigmoid(g * alpha);
  return (u + 1) * glu;
}

bool clamped_swiglu_supported(const at::Tensor& gate, const at::Tensor& up) {
  const auto dt = gate.scalar_type();
  return cuda_kernels_compiled() && gate.is_cuda() && up.device() == gate.device() &&
         up.scalar_type() == dt && up.sizes() == gate.sizes() && kernel_dtype(dt);
}

at::Tensor clamped_swiglu_activation(const at::Tensor& gate, const at::Tensor& up, double limit,
                                     double alpha, bool fused) {
  if (fused && clamped_swiglu_supported(gate, up)) return clamped_swiglu(gate, up, limit, alpha);
  return clamped_swiglu_reference(gate, up, limit, alpha);
}

#ifdef MOE_HAVE_CUDA

namespace {

// Under create_graph (a second derivative asked for) the raw kernel's gradients would carry no
// graph: the backward is taken with ATen ops then, differentiable, the same formula (the clamps'
// masks are constants).
std::pair<at::Tensor, at::Tensor> differentiable_backward(const at::Tensor& dh,
                                                          const at::Tensor& gate,
                                                          const at::Tensor& up, double limit,
                                                          double alpha) {
  const auto g = gate.clamp_max(limit), u = up.clamp(-limit, limit);
  const auto sig = torch::sigmoid(g * alpha);
  const auto zero = at::zeros({}, dh.options());
  const auto d_glu = dh * (u + 1);
  const auto d_g = d_glu * sig + d_glu * g * (sig * (1 - sig)) * alpha;
  return {torch::where(gate <= limit, d_g, zero),
          torch::where((up >= -limit).logical_and(up <= limit), dh * (g * sig), zero)};
}

class ClampedSwiglu : public torch::autograd::Function<ClampedSwiglu> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up, double limit, double alpha) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["alpha"] = alpha;
    return detail::clamped_swiglu_forward(gate, up, limit, alpha);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const double limit = ctx->saved_data["limit"].toDouble();
    const double alpha = ctx->saved_data["alpha"].toDouble();
    auto [d_gate, d_up] = at::GradMode::is_enabled()
                              ? differentiable_backward(grads[0], s[0], s[1], limit, alpha)
                              : detail::clamped_swiglu_backward(grads[0], s[0], s[1], limit, alpha);
    return {d_gate, d_up, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor clamped_swiglu(const at::Tensor& gate, const at::Tensor& up, double limit,
                          double alpha) {
  return ClampedSwiglu::apply(gate, up, limit, alpha);
}

#else

at::Tensor clamped_swiglu(const at::Tensor&, const at::Tensor&, double, double) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

namespace detail {
at::Tensor clamped_swiglu_forward(const at::Tensor&, const at::Tensor&, double, double, bool) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
std::pair<at::Tensor, at::Tensor> clamped_swiglu_backward(const at::Tensor&, const at::Tensor&,
                                                          const at::Tensor&, double, double, bool) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace detail

#endif

}  // namespace moe::kernels
