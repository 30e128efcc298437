// The dispatcher (dispatcher.h): the ATen reference dispatch_plan / permute / combine, and the
// Dispatcher that picks them or the CUDA kernels of the same names.
#include "moe/moe/dispatcher.h"

#include <ATen/ATen.h>

#include "moe/kernels/permute.h"
#include "moe/util/errors.h"

namespace moe::moe {

DispatchPlan dispatch_plan(const torch::Tensor& topk_idx, const torch::Tensor& keep,
                           int64_t num_experts) {
  DispatchPlan p;
  const int64_t k = topk_idx.size(1);
  auto kept = keep.reshape(-1).nonzero().squeeze(1);  // ascending assignment ids
  auto experts = topk_idx.reshape(-1).index_select(0, kept);
  // A stable sort by expert keeps ascending assignment (hence token) order within an expert.
  auto order = std::get<1>(at::sort(experts, /*stable=*/true, 0, /*descending=*/false));
  p.source_assignment = kept.index_select(0, order);
  p.source_token = at::floor_divide(p.source_assignment, k);
  p.tokens_per_expert = at::bincount(experts, {}, num_experts);
  return p;
}

DispatchPlan dispatch_plan_all_kept(const torch::Tensor& topk_idx,
                                    const torch::Tensor& tokens_per_expert) {
  DispatchPlan p;
  const int64_t k = topk_idx.size(1);
  auto order = std::get<1>(at::sort(topk_idx.reshape(-1), /*stable=*/true, 0, false));
  p.source_assignment = order;
  p.source_token = at::floor_divide(order, k);
  p.tokens_per_expert = tokens_per_expert;
  return p;
}

torch::Tensor permute(const torch::Tensor& x, const DispatchPlan& plan) {
  return x.index_select(0, plan.source_token);
}

torch::Tensor combine(const torch::Tensor& y, const DispatchPlan& plan,
                      const torch::Tensor& weights, int64_t num_tokens) {
  // Accumulate in fp32 (or wider: double inputs stay double for gradient checks).
  const auto acc = at::promote_types(y.scalar_type(), at::kFloat);
  auto w = weights.reshape(-1).index_select(0, plan.source_assignment).to(acc);
  auto contrib = y.to(acc) * w.unsqueeze(1);
  auto out = at::zeros({num_tokens, y.size(1)}, y.options().dtype(acc));
  return out.index_add(0, plan.source_token, contrib).to(y.scalar_type());
}

DispatchPlan Dispatcher::plan(const torch::Tensor& topk_idx, const torch::Tensor& keep,
                              bool all_kept, const torch::Tensor& tokens_per_expert) const {
  if (all_kept && path_ == KernelPath::kCuda) {  // counts -> prefix sum -> rows, our kernel
    auto [source_token, source_assignment, counts] = kernels::dispatch_plan(topk_idx, num_experts_);
    return {source_token, source_assignment, counts};
  }
  if (all_kept) return dispatch_plan_all_kept(topk_idx, tokens_per_expert);
  return dispatch_plan(topk_idx, keep, num_experts_);
}

torch::Tensor Dispatcher::permute(const torch::Tensor& x, const DispatchPlan& plan) const {
  // Qualified: the member permute() would otherwise hide the reference of the same name.
  if (path_ == KernelPath::kReference) return ::moe::moe::permute(x, plan);
  TORCH_CHECK(x.is_cuda(), "moe layer: built for the CUDA kernels, given activations on ",
              x.device());
  return kernels::permute(x, plan.source_token, plan.source_assignment, top_k_);
}

torch::Tensor Dispatcher::combine(const torch::Tensor& y, const DispatchPlan& plan,
                                  const torch::Tensor& weights, int64_t num_tokens) const {
  if (path_ == KernelPath::kReference) return ::moe::moe::combine(y, plan, weights, num_tokens);
  return kernels::combine(y, plan.source_token, plan.source_assignment, weights, num_tokens);
}

KernelPath resolve_kernel_path(config::MoeKernels setting, bool on_cuda) {
  if (setting == config::MoeKernels::kReference) return KernelPath::kReference;
  if (setting == config::MoeKernels::kCuda) {
    if (!kernels::cuda_kernels_compiled()) {
      throw UserError(
          "moe.kernels = \"cuda\": this build has no CUDA kernels (nvcc was "
          "not found at build time); use \"reference\" or \"auto\"");
    }
    if (!on_cuda) {
      throw UserError(
          "moe.kernels = \"cuda\": the model runs on the CPU; use "
          "\"reference\" or \"auto\"");
    }
    return KernelPath::kCuda;
  }
  return on_cuda && kernels::cuda_kernels_compiled() ? KernelPath::kCuda : KernelPath::kReference;
}

}  // namespace moe::moe
