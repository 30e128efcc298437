#include "moe/train/chunked_lm_loss.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <algorithm>

namespace moe::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ChunkedLmLoss : public torch::autograd::Function<ChunkedLmLoss> {
 public:
  static constexpr int64_t kHiddenGrad = 1, kWeightGrad = 2;  // which gradients to compute

  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               const torch::Tensor& keep, const torch::Tensor& count, int64_t chunk,
                               int64_t compute_dtype, int64_t grads, double softcap) {
    const auto compute = static_cast<torch::ScalarType>(compute_dtype);
    const bool hidden_grad = (grads & kHiddenGrad) != 0, weight_grad = (grads & kWeightGrad) != 0;
    const int64_t N = hidden.size(0);
    const auto f32 = hidden.options().dtype(torch::kFloat);
    const auto w = weight.to(compute);
    const auto kept = keep.to(torch::kFloat);
    auto loss_sum = torch::zeros({}, f32);
    // Gradients of the loss *sum*; 1 / count is applied in fp32 at the end, so the 16-bit
    // operands hold softmax - one-hot in [-1, 1]. fp16 takes the weight gradient's product in
    // fp32: summed over a chunk of rows it could pass fp16's 65504, and a loss scale, applied
    // only in the backward, could not bring it back.
    const bool fp16 = compute == torch::kHalf;
    torch::Tensor grad_hidden = hidden_grad ? torch::empty(hidden.sizes(), f32) : torch::Tensor();
    torch::Tensor grad_weight = weight_grad ? torch::zeros(weight.sizes(), f32) : torch::Tensor();
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const auto h = hidden.narrow(0, s, n).to(compute);
      auto logits = torch::matmul(h, w.t()).to(torch::kFloat);  // [n, V]
      torch::Tensor capped;  // tanh(z / c): d(c tanh(z / c)) / dz = 1 - tanh^2
      if (softcap > 0) {
        capped = torch::tanh(logits / softcap);
        logits = capped * softcap;
      }
      const auto keep_c = kept.narrow(0, s, n);
      // Ignored positions (kIgnoredTarget) read class 0; their rows are masked out below.
      const auto target = targets.narrow(0, s, n).clamp_min(0).unsqueeze(1);
      const auto lse = torch::logsumexp(logits, 1, /*keepdim=*/true);
      loss_sum.add_(((lse - logits.gather(1, target)).squeeze(1) * keep_c).sum());
      auto& g = logits.sub_(lse).exp_();  // softmax, in place
      g.scatter_add_(1, target, torch::full({n, 1}, -1.0f, f32));
      g.mul_(keep_c.unsqueeze(1));
      if (softcap > 0) g.mul_(1 - capped.square());
      const auto g16 = g.to(compute);
      if (hidden_grad) grad_hidden.narrow(0, s, n).copy_(torch::matmul(g16, w));
      if (weight_grad) {
        grad_weight.add_(fp16 ? torch::matmul(g.t(), h.to(torch::kFloat))
                              : torch::matmul(g16.t(), h));
      }
    }
    const auto inv_count = count.to(torch::kFloat).clamp_min(1.0).reciprocal();
    if (hidden_grad) grad_hidden.mul_(inv_count);
    if (weight_grad) grad_weight.mul_(inv_count);
    ctx->save_for_backward({grad_hidden, grad_weight});
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss_sum * inv_count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& go = grads[0];
    const auto hidden_dtype =
        static_cast<torch::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype =
        static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    torch::Tensor gh, gw;
    if (saved[0].defined()) gh = (saved[0] * go).to(hidden_dtype);
    if (saved[1].defined()) gw = (saved[1] * go).to(weight_dtype);
    return {gh,
            gw,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                              const LossTargets& t, int64_t chunk_tokens, double softcap) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "chunked_lm_loss: hidden ", hidden.sizes(), " and weight ", weight.sizes(),
              " do not multiply");
  TORCH_CHECK(chunk_tokens >= 1, "chunked_lm_loss: chunk_tokens = ", chunk_tokens);
  const auto device = hidden.device().type();
  const auto compute = at::autocast::is_autocast_enabled(device)
                           ? at::autocast::get_autocast_dtype(device)
                           : weight.scalar_type();
  // The function casts by itself; autocast would otherwise re-cast each matmul's operands.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // Only the gradients a backward will ask for (none under no_grad: evaluation-style calls).
  const bool grad = torch::GradMode::is_enabled();
  const int64_t grads = (grad && hidden.requires_grad() ? ChunkedLmLoss::kHiddenGrad : 0) |
                        (grad && weight.requires_grad() ? ChunkedLmLoss::kWeightGrad : 0);
  return ChunkedLmLoss::apply(hidden, weight, t.targets, t.keep, t.count, chunk_tokens,
                              static_cast<int64_t>(compute), grads, softcap);
}

}  // namespace moe::train
