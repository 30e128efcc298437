#include "moe/moe/moe_layer.h"

#include <torch/torch.h>

#include "moe/kernels/permute.h"
#include "moe/moe/dispatcher.h"

namespace moe::moe {

MoeLayerImpl::MoeLayerImpl(const MoeLayerOptions& opt) : opt_(opt) {
  router = register_module("router", Router(opt.router));
  experts = register_module("experts", Experts(opt.experts));
  if (opt.shared_expert_hidden_size > 0) {
    ExpertsOptions shared = opt.experts;
    shared.num_experts = 1;
    shared.ffn_size = opt.shared_expert_hidden_size;
    shared_expert = register_module("shared_expert", Experts(shared));
  }
}

MoeLayerOutput MoeLayerImpl::forward(const torch::Tensor& x) {
  MoeLayerOutput out;
  const KernelPath path = resolve_kernel_path(opt_.kernels, x.is_cuda());
  Routing r = router->forward(x, /*fused_kernel=*/path == KernelPath::kCuda);
  const int64_t T = x.size(0);
  DispatchPlan plan;
  if (r.all_kept && path == KernelPath::kCuda) {  // counts -> prefix sum -> rows, our kernel
    auto [source_token, source_assignment, counts] =
        kernels::detail::dispatch_plan(r.topk_idx, opt_.router.num_experts);
    plan = {source_token, source_assignment, counts};
  } else if (r.all_kept) {
    plan = plan_dispatch_all_kept(r.topk_idx, r.tokens_per_expert);
  } else {
    plan = plan_dispatch(r.topk_idx, r.keep, opt_.router.num_experts);
  }
  torch::Tensor permuted =
      path == KernelPath::kCuda
          ? kernels::permute_rows(x, plan.source_token, plan.source_assignment, opt_.router.top_k)
          : permute_tokens(x, plan);
  torch::Tensor y = experts->forward(permuted, plan.tokens_per_expert);
  out.y = path == KernelPath::kCuda
              ? kernels::unpermute_combine(y, plan.source_token, plan.source_assignment,
                                           r.topk_weight, T)
              : unpermute_combine(y, plan, r.topk_weight, T);
  if (shared_expert) {
    out.y = out.y + shared_expert->forward(x, torch::full({1}, T, x.options().dtype(torch::kLong)));
  }
  out.aux_loss = r.aux_loss;
  out.z_loss = r.z_loss;
  out.tokens_per_expert = r.tokens_per_expert;
  out.dropped = r.dropped;
  return out;
}

}  // namespace moe::moe
