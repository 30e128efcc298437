#include "moe/model/rms_norm.h"

#include <torch/torch.h>

namespace moe::model {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // torch 2.11's fused CUDA kernel (one pass each way) takes input and weight of one dtype; a
  // bf16 input with the fp32 weight (q_norm/k_norm on a projection's output under autocast)
  // falls back to ~8 composite kernels forward, more backward, and warns. Give the weight the
  // input's dtype on CUDA, as a bf16 model holds it (Megatron; Hugging Face checkpoints store it
  // so); the output's dtype is the input's either way. Not fp16: the fused kernel's weight
  // gradient would be an fp16 sum over every row (and head), which a loss scale overflows
  // first. The CPU has no fused kernel: unchanged.
  if (x.is_cuda() && x.scalar_type() == torch::kBFloat16 &&
      weight.scalar_type() != torch::kBFloat16) {
    return at::rms_norm(x, {weight.size(0)}, weight.to(x.scalar_type()), eps_);
  }
  return at::rms_norm(x, {weight.size(0)}, weight, eps_);
}

}  // namespace moe::model
