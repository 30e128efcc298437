#include "moe/model/rms_norm.h"

#include <torch/torch.h>

namespace moe::model {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool zero_centered)
    : eps_(eps), zero_centered_(zero_centered) {
  weight = register_parameter("weight", zero_centered ? torch::zeros({dim}) : torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Zero-centred: 1 + w in fp32 (transformers' GemmaRMSNorm), then as below.
  const torch::Tensor w = zero_centered_ ? weight.to(torch::kFloat) + 1.0 : weight;
  // torch 2.11's fused CUDA kernel (one pass each way) takes input and weight of one dtype; a
  // bf16 input with the fp32 weight (q_norm/k_norm on a projection's output under autocast)
  // falls back to ~8 composite kernels forward, more backward, and warns. Give the weight the
  // input's dtype on CUDA, as a bf16 model holds it (Megatron; Hugging Face checkpoints store it
  // so); the output's dtype is the input's either way. Not fp16: the fused kernel's weight
  // gradient would be an fp16 sum over every row (and head), which a loss scale overflows
  // first. The CPU has no fused kernel: unchanged.
  if (x.is_cuda() && x.scalar_type() == torch::kBFloat16 && w.scalar_type() != torch::kBFloat16) {
    return at::rms_norm(x, {w.size(0)}, w.to(x.scalar_type()), eps_);
  }
  return at::rms_norm(x, {w.size(0)}, w, eps_);
}

}  // namespace moe::model
