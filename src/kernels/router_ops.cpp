// The router family's autograd op, score_and_select, around the raw launches of
// src/kernels/router.cu. In a CPU-only build the op reports that the kernels are absent; the
// router never selects it there.
#include <optional>

#include <torch/autograd.h>
#include <torch/types.h>

#include "moe/kernels/router.h"

namespace moe::kernels {

#ifdef MOE_HAVE_CUDA

namespace {

class ScoreAndSelect : public torch::autograd::Function<ScoreAndSelect> {
 public:
  // Outputs: probs, topk_weight, lse (differentiable), topk_idx, counts (not).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& logits,
                                                const std::optional<torch::Tensor>& bias,
                                                int64_t top_k, bool sigmoid_scores,
                                                bool normalize_topk, int64_t n_group,
                                                int64_t topk_group, int64_t group_score_experts) {
    // The selection (groups included) is not differentiable: the backward is the same for any.
    ScoreAndSelectOutput o = detail::score_and_select_forward(
        logits, bias.value_or(torch::Tensor()), top_k, sigmoid_scores, normalize_topk,
        /*poison=*/false, n_group, topk_group, group_score_experts);
    // The softmax backward needs only the probs; sigmoid also needs the logits (z-loss term).
    ctx->save_for_backward(
        {sigmoid_scores ? logits : torch::Tensor(), o.probs, o.topk_idx, o.topk_weight, o.lse});
    ctx->set_materialize_grads(false);  // absent gradients stay undefined: the kernel skips them
    ctx->saved_data["sigmoid"] = sigmoid_scores;
    ctx->saved_data["normalize"] = normalize_topk;
    ctx->mark_non_differentiable({o.topk_idx, o.tokens_per_expert});
    return {o.probs, o.topk_weight, o.lse, o.topk_idx, o.tokens_per_expert};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto g = detail::score_and_select_backward(s[0], s[1], s[2], s[3], s[4], grads[0], grads[1],
                                               grads[2], ctx->saved_data["sigmoid"].toBool(),
                                               ctx->saved_data["normalize"].toBool());
    torch::autograd::variable_list out(8);  // one per forward argument: the logits' only
    out[0] = g;
    return out;
  }
};

}  // namespace

ScoreAndSelectOutput score_and_select(const at::Tensor& logits, const at::Tensor& bias,
                                      int64_t top_k, bool sigmoid_scores, bool normalize_topk,
                                      int64_t n_group, int64_t topk_group,
                                      int64_t group_score_experts) {
  // No bias is passed as nullopt, not as an undefined tensor: Function::apply records every
  // tensor argument's device and dtype, which an undefined tensor has not ("tensor does not
  // have a device" on the first GPU run). The bias takes no gradient either way.
  std::optional<at::Tensor> maybe_bias;
  if (bias.defined()) maybe_bias = bias;
  auto outs = ScoreAndSelect::apply(logits, maybe_bias, top_k, sigmoid_scores, normalize_topk,
                                    n_group, topk_group, group_score_experts);
  return {outs[0], outs[3], outs[1], outs[2], outs[4]};
}

#else

ScoreAndSelectOutput score_and_select(const at::Tensor&, const at::Tensor&, int64_t, bool, bool,
                                      int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}

namespace detail {
ScoreAndSelectOutput score_and_select_forward(const at::Tensor&, const at::Tensor&, int64_t, bool,
                                              bool, bool, int64_t, int64_t, int64_t) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
at::Tensor score_and_select_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, bool, bool) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace detail

#endif

}  // namespace moe::kernels
