// The permute family's autograd ops (dispatch_plan, permute, combine) around the raw launches of
// src/kernels/permute.cu. In a CPU-only build the ops report that the kernels are absent;
// resolve_kernel_path() never selects them there.
#include <torch/autograd.h>
#include <torch/types.h>

#include "moe/kernels/permute.h"

namespace moe::kernels {

#ifdef MOE_HAVE_CUDA

bool cuda_kernels_compiled() { return true; }

namespace {

class Permute : public torch::autograd::Function<Permute> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& source_token,
                               const torch::Tensor& rows_of_assignment, int64_t top_k) {
    ctx->save_for_backward({rows_of_assignment});
    ctx->saved_data["top_k"] = top_k;
    return detail::permute_forward(x.contiguous(), rows_of_assignment, top_k, source_token.numel());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto rows = ctx->get_saved_variables()[0];
    auto gx =
        detail::permute_backward(grads[0].contiguous(), rows, ctx->saved_data["top_k"].toInt());
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class Combine : public torch::autograd::Function<Combine> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& y,
                               const torch::Tensor& weights,
                               const torch::Tensor& rows_of_assignment) {
    auto yc = y.contiguous();
    auto w = weights.to(torch::kFloat).contiguous();
    ctx->save_for_backward({yc, w, rows_of_assignment});
    ctx->saved_data["weights_dtype"] = static_cast<int64_t>(weights.scalar_type());
    return detail::combine_forward(yc, rows_of_assignment, w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto [gy, gw] = detail::combine_backward(grads[0].contiguous(), s[0], s[2], s[1]);
    auto wdtype = static_cast<torch::ScalarType>(ctx->saved_data["weights_dtype"].toInt());
    return {gy, gw.to(wdtype), torch::Tensor()};
  }
};

}  // namespace

std::array<at::Tensor, 3> dispatch_plan(const at::Tensor& topk_idx, int64_t num_experts) {
  return detail::dispatch_plan(topk_idx, num_experts);
}

at::Tensor permute(const at::Tensor& x, const at::Tensor& source_token,
                   const at::Tensor& source_assignment, int64_t top_k) {
  // The backward sums, per token, the gradients of its destination rows: it needs the inverse map.
  auto rows = detail::assignment_rows(source_assignment, x.size(0) * top_k);
  return Permute::apply(x, source_token, rows, top_k);
}

at::Tensor combine(const at::Tensor& y, const at::Tensor& source_token,
                   const at::Tensor& source_assignment, const at::Tensor& weights,
                   int64_t num_tokens) {
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) == num_tokens, "moe kernels: weights must be [",
              num_tokens, ", k], got ", weights.sizes());
  auto rows = detail::assignment_rows(source_assignment, weights.numel());
  (void)source_token;  // the rows of the inverse map say everything the kernels need
  return Combine::apply(y, weights, rows);
}

#else

bool cuda_kernels_compiled() { return false; }

std::array<at::Tensor, 3> dispatch_plan(const at::Tensor&, int64_t) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

at::Tensor permute(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

at::Tensor combine(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   int64_t) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

// The raw launches too, so tests and benchmarks link (and skip) in a build without nvcc.
namespace detail {
[[noreturn]] void no_kernels() { TORCH_CHECK(false, "moe-train was built without CUDA kernels"); }
std::array<at::Tensor, 3> dispatch_plan(const at::Tensor&, int64_t, bool) { no_kernels(); }
at::Tensor assignment_rows(const at::Tensor&, int64_t) { no_kernels(); }
at::Tensor permute_forward(const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool) {
  no_kernels();
}
at::Tensor permute_backward(const at::Tensor&, const at::Tensor&, int64_t, bool) { no_kernels(); }
at::Tensor combine_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool) {
  no_kernels();
}
std::pair<at::Tensor, at::Tensor> combine_backward(const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, bool) {
  no_kernels();
}
}  // namespace detail

#endif

}  // namespace moe::kernels
