// The SwiGLU family's autograd ops (silu and gelu_tanh gates) around the raw launches of
// src/kernels/swiglu.cu, and the launch shape both the launcher and the CPU emulation use. In a
// CPU-only build the op reports that the kernels are absent; the FFNs never select it there.
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/types.h>

#include "moe/kernels/permute.h"  // cuda_kernels_compiled
#include "moe/kernels/swiglu.h"

namespace moe::kernels {

namespace {

bool kernel_dtype(at::ScalarType dt) {
  return dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16;
}

// Each operand has `sizes`, `first`'s dtype and contiguous rows; returns whether all start on a
// 16-byte boundary. `first` names the shape in the error (gate, or gate_up).
bool check_operands(const char* name, const at::Tensor& first,
                    std::initializer_list<std::pair<const at::Tensor*, c10::IntArrayRef>> ops) {
  const auto dt = first.scalar_type();
  TORCH_CHECK(kernel_dtype(dt), "moe kernels: swiglu: ", name, " must be fp32, fp16 or bf16, got ",
              dt);
  bool aligned = true;
  for (const auto& [t, sizes] : ops) {
    TORCH_CHECK(t->sizes() == sizes && t->scalar_type() == dt,
                "moe kernels: swiglu: an operand of ", t->sizes(), " ", t->scalar_type(), " for ",
                name, " ", first.sizes(), " ", dt);
    TORCH_CHECK(t->is_contiguous(), "moe kernels: swiglu: operands must be contiguous");
    aligned = aligned && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
  }
  return aligned;
}

}  // namespace

namespace detail {

swiglu_rows::SwigluShape swiglu_shape(const at::Tensor& gate, const at::Tensor& up,
                                      std::initializer_list<const at::Tensor*> others) {
  bool aligned = check_operands("gate", gate, {{&gate, gate.sizes()}, {&up, gate.sizes()}});
  for (const at::Tensor* t : others)
    aligned = check_operands("gate", gate, {{t, gate.sizes()}}) && aligned;
  swiglu_rows::SwigluShape s;
  s.n = gate.numel();
  s.cols = s.stride = s.n;  // one flat row
  const int pack = static_cast<int>(16 / gate.element_size());
  s.vec = aligned && s.n % pack == 0 ? pack : 1;
  return s;
}

swiglu_rows::SwigluShape swiglu_packed_shape(const at::Tensor& gate_up,
                                             std::initializer_list<const at::Tensor*> halves,
                                             std::initializer_list<const at::Tensor*> packed) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
              "moe kernels: swiglu: gate_up must have an even last dimension (gate then up), got ",
              gate_up.sizes());
  bool aligned = check_operands("gate_up", gate_up, {{&gate_up, gate_up.sizes()}});
  auto half_sizes = gate_up.sizes().vec();
  half_sizes.back() /= 2;
  for (const at::Tensor* t : halves) {
    aligned = check_operands("gate_up", gate_up, {{t, half_sizes}}) && aligned;
  }
  for (const at::Tensor* t : packed) {
    aligned = check_operands("gate_up", gate_up, {{t, gate_up.sizes()}}) && aligned;
  }
  swiglu_rows::SwigluShape s;
  s.cols = half_sizes.back();
  s.stride = 2 * s.cols;
  s.n = gate_up.numel() / 2;
  const int pack = static_cast<int>(16 / gate_up.element_size());
  s.vec = aligned && s.cols % pack == 0 ? pack : 1;
  return s;
}

}  // namespace detail

bool swiglu_supported(const at::Tensor& gate, const at::Tensor& up) {
  const auto dt = gate.scalar_type();
  return cuda_kernels_compiled() && gate.is_cuda() && up.device() == gate.device() &&
         up.scalar_type() == dt && up.sizes() == gate.sizes() && kernel_dtype(dt);
}

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) {
  return torch::silu(gate) * up;
}

at::Tensor swiglu_activation(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  return fused && swiglu_supported(gate, up) ? swiglu(gate, up) : swiglu_reference(gate, up);
}

at::Tensor geglu_reference(const at::Tensor& gate, const at::Tensor& up) {
  return torch::gelu(gate, "tanh") * up;
}

at::Tensor geglu_activation(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  // The same operands as swiglu's kernel takes: one launcher serves both gates.
  return fused && swiglu_supported(gate, up) ? geglu(gate, up) : geglu_reference(gate, up);
}

bool swiglu_packed_supported(const at::Tensor& gate_up) {
  const auto dt = gate_up.scalar_type();
  return cuda_kernels_compiled() && gate_up.is_cuda() && gate_up.dim() >= 1 &&
         gate_up.size(-1) % 2 == 0 && kernel_dtype(dt);
}

at::Tensor swiglu_packed_reference(const at::Tensor& gate_up) {
  const auto parts = gate_up.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

at::Tensor swiglu_packed_activation(const at::Tensor& gate_up, bool fused) {
  return fused && swiglu_packed_supported(gate_up) ? swiglu_packed(gate_up)
                                                   : swiglu_packed_reference(gate_up);
}

at::Tensor geglu_packed_reference(const at::Tensor& gate_up) {
  const auto parts = gate_up.chunk(2, -1);
  return torch::gelu(parts[0], "tanh") * parts[1];
}

at::Tensor geglu_packed_activation(const at::Tensor& gate_up, bool fused) {
  return fused && swiglu_packed_supported(gate_up) ? geglu_packed(gate_up)
                                                   : geglu_packed_reference(gate_up);
}

#ifdef MOE_HAVE_CUDA

namespace {

using swiglu_rows::Gate;

// Under create_graph (a second derivative asked for) the raw kernels' gradients would carry no
// graph: the backward is taken with ATen ops then, differentiable, the same formula.
template <Gate G>
std::pair<at::Tensor, at::Tensor> differentiable_backward(const at::Tensor& dh,
                                                          const at::Tensor& gate,
                                                          const at::Tensor& up) {
  if constexpr (G == Gate::kGeluTanh) {
    return {at::gelu_backward(dh * up, gate, "tanh"), dh * torch::gelu(gate, "tanh")};
  } else {
    const auto sig = torch::sigmoid(gate);
    return {dh * up * sig * (1 + gate * (1 - sig)), dh * (gate * sig)};
  }
}

template <Gate G>
class GatedProduct : public torch::autograd::Function<GatedProduct<G>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate,
                            const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return detail::swiglu_forward(gate, up, /*poison=*/false, G);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [d_gate, d_up] = at::GradMode::is_enabled()
                              ? differentiable_backward<G>(grads[0], s[0], s[1])
                              : detail::swiglu_backward(grads[0], s[0], s[1], false, G);
    return {d_gate, d_up};
  }
};

template <Gate G>
class GatedProductPacked : public torch::autograd::Function<GatedProductPacked<G>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return detail::swiglu_packed_forward(gate_up, /*poison=*/false, G);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto gate_up = ctx->get_saved_variables()[0];
    if (at::GradMode::is_enabled()) {
      const auto parts = gate_up.chunk(2, -1);
      const auto [d_gate, d_up] = differentiable_backward<G>(grads[0], parts[0], parts[1]);
      return {torch::cat({d_gate, d_up}, -1)};
    }
    return {detail::swiglu_packed_backward(grads[0], gate_up, false, G)};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return GatedProduct<Gate::kSilu>::apply(gate, up);
}

at::Tensor swiglu_packed(const at::Tensor& gate_up) {
  return GatedProductPacked<Gate::kSilu>::apply(gate_up);
}

at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up) {
  return GatedProduct<Gate::kGeluTanh>::apply(gate, up);
}

at::Tensor geglu_packed(const at::Tensor& gate_up) {
  return GatedProductPacked<Gate::kGeluTanh>::apply(gate_up);
}

#else

namespace {
[[noreturn]] void no_swiglu_kernels() {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace

at::Tensor swiglu(const at::Tensor&, const at::Tensor&) { no_swiglu_kernels(); }
at::Tensor swiglu_packed(const at::Tensor&) { no_swiglu_kernels(); }
at::Tensor geglu(const at::Tensor&, const at::Tensor&) { no_swiglu_kernels(); }
at::Tensor geglu_packed(const at::Tensor&) { no_swiglu_kernels(); }

namespace detail {
at::Tensor swiglu_forward(const at::Tensor&, const at::Tensor&, bool, swiglu_rows::Gate) {
  no_swiglu_kernels();
}
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, bool, swiglu_rows::Gate) {
  no_swiglu_kernels();
}
at::Tensor swiglu_packed_forward(const at::Tensor&, bool, swiglu_rows::Gate) {
  no_swiglu_kernels();
}
at::Tensor swiglu_packed_backward(const at::Tensor&, const at::Tensor&, bool, swiglu_rows::Gate) {
  no_swiglu_kernels();
}
}  // namespace detail

#endif

}  // namespace moe::kernels
