// The dispatcher: the ATen reference dispatch_plan / permute / combine (CPU path, test oracle) and
// the Dispatcher that runs them or our CUDA kernels of the same names (moe/kernels/permute.h).
//
// permute moves token rows into expert-contiguous order (stable: within an expert, token order is
// kept); combine adds the expert outputs back with the gate weights, accumulating in fp32.
#pragma once

#include <torch/types.h>

#include "moe/config/choices.h"

namespace moe::moe {

struct DispatchPlan {
  torch::Tensor source_token;       // [N] int64: token row feeding destination row r
  torch::Tensor source_assignment;  // [N] int64: flat assignment t * k + j of destination row r
  torch::Tensor tokens_per_expert;  // [E] int64; N = sum
};

// Plans the permutation of kept assignments. topk_idx, keep: [T, k].
DispatchPlan dispatch_plan(const torch::Tensor& topk_idx, const torch::Tensor& keep,
                           int64_t num_experts);

// The same plan when every assignment is kept (dropless): N = T * k, fixed shapes and no host
// sync (the counts come from the router), which CUDA-graph capture needs.
DispatchPlan dispatch_plan_all_kept(const torch::Tensor& topk_idx,
                                    const torch::Tensor& tokens_per_expert);

// x [T, d] -> [N, d] rows in expert order.
torch::Tensor permute(const torch::Tensor& x, const DispatchPlan& plan);

// y [N, d] expert outputs, weights [T, k] fp32 -> out [T, d] in y's dtype;
// out[t] = sum over t's kept assignments a of weights[a] * y[row(a)], summed in fp32.
torch::Tensor combine(const torch::Tensor& y, const DispatchPlan& plan,
                      const torch::Tensor& weights, int64_t num_tokens);

enum class KernelPath { kReference, kCuda };
// moe.kernels for a model that runs on CUDA (on_cuda) or the CPU: "auto" -> cuda on CUDA when the
// kernels were compiled in, else reference. UserError for "cuda" where it cannot run.
KernelPath resolve_kernel_path(config::MoeKernels setting, bool on_cuda);

// Dispatch -> (experts) -> combine, on the path chosen once when the layer is built: the ATen
// reference above, or our CUDA kernels (moe/kernels/permute.h). Both take the same DispatchPlan.
class Dispatcher {
 public:
  Dispatcher(KernelPath path, int64_t num_experts, int64_t top_k)
      : path_(path), num_experts_(num_experts), top_k_(top_k) {}
  // The plan of a routing (topk_idx, keep [T, k]; counts [E] when every assignment is kept).
  DispatchPlan plan(const torch::Tensor& topk_idx, const torch::Tensor& keep, bool all_kept,
                    const torch::Tensor& tokens_per_expert) const;
  torch::Tensor permute(const torch::Tensor& x, const DispatchPlan& plan) const;
  torch::Tensor combine(const torch::Tensor& y, const DispatchPlan& plan,
                        const torch::Tensor& weights, int64_t num_tokens) const;
  KernelPath path() const { return path_; }

 private:
  KernelPath path_;
  int64_t num_experts_, top_k_;
};

}  // namespace moe::moe
