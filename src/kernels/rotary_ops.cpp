// The rotary family's autograd op around the raw launches of src/kernels/rotary.cu, and the
// launch shape both the launcher and the CPU emulation use. In a CPU-only build the op reports
// that the kernels are absent; attention never selects it there.
#include <torch/autograd.h>
#include <torch/types.h>

#include "moe/kernels/rotary.h"

namespace moe::kernels {

namespace detail {

rotary_rows::RotaryShape rotary_shape(const at::Tensor& x, const at::Tensor& cos,
                                      const at::Tensor& sin, const at::Tensor& out) {
  TORCH_CHECK(x.dim() == 4, "moe kernels: rotary: x must be [B, N, S, hd], got ", x.sizes());
  const int64_t B = x.size(0), S = x.size(2), hd = x.size(3);
  TORCH_CHECK(hd % 2 == 0, "moe kernels: rotary: head_dim ", hd, " is odd");
  TORCH_CHECK(x.stride(3) == 1 && out.stride(3) == 1,
              "moe kernels: rotary: the last dimension must be contiguous");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "moe kernels: rotary: output ", out.sizes(), " for x ", x.sizes());
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "moe kernels: rotary: table dtype ",
                t->scalar_type(), " for x of ", x.scalar_type());
    TORCH_CHECK(t->is_contiguous() && t->device() == x.device(),
                "moe kernels: rotary: tables must be contiguous and on x's device");
    const bool shared = t->dim() == 2 && t->size(0) == S && t->size(1) == hd;
    const bool per_row =
        t->dim() == 4 && t->size(0) == B && t->size(1) == 1 && t->size(2) == S && t->size(3) == hd;
    TORCH_CHECK(shared || per_row, "moe kernels: rotary: tables must be [", S, ", ", hd, "] or [",
                B, ", 1, ", S, ", ", hd, "], got ", t->sizes());
  }
  TORCH_CHECK(cos.sizes() == sin.sizes(), "moe kernels: rotary: cos ", cos.sizes(), " vs sin ",
              sin.sizes());
  rotary_rows::RotaryShape s;
  s.B = B, s.N = x.size(1), s.S = S, s.hd = hd;
  for (int i = 0; i < 3; ++i) s.x_stride[i] = x.stride(i), s.out_stride[i] = out.stride(i);
  s.table_batch_stride = cos.dim() == 4 ? S * hd : 0;
  // 16-byte packs when every row start of every buffer is 16-byte aligned and a half row is a
  // whole number of packs; else one element per thread.
  const int64_t b = x.element_size();
  bool packs = (hd / 2 * b) % 16 == 0;
  for (int i = 0; i < 3; ++i) {
    packs = packs && (x.stride(i) * b) % 16 == 0 && (out.stride(i) * b) % 16 == 0;
  }
  for (const void* p : {x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr()}) {
    packs = packs && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  }
  s.vec = packs ? static_cast<int>(16 / b) : 1;
  return s;
}

at::Tensor rotary_output(const at::Tensor& x) {
  return at::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2);
}

}  // namespace detail

#ifdef MOE_HAVE_CUDA

namespace {

class Rotary : public torch::autograd::Function<Rotary> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return detail::rotary_apply(x, cos, sin, /*backward=*/false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    return {detail::rotary_apply(grads[0], s[0], s[1], /*backward=*/true), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return Rotary::apply(x, cos, sin);
}

#else

at::Tensor rotary(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

namespace detail {
at::Tensor rotary_apply(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace detail

#endif

}  // namespace moe::kernels
