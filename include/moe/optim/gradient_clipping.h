// Gradient clipping as torch.nn.utils.clip_grad_norm_ computes it, in one place: the global norm,
// its coefficient min(1, max_norm / (norm + 1e-6)) applied in place, or the coefficient's
// reciprocal handed to the fused AdamW as its grad_scale (clipping folded into the update). The
// one-process runners, ZeRO's shards and the expert-parallel groups all clip through these.
#pragma once

#include <vector>

#include <torch/types.h>

namespace moe::optim {

// The global L2 norm of `grads` on their device, no host sync (16-bit ones summed in fp32).
torch::Tensor gradient_norm(const std::vector<torch::Tensor>& grads);
// What clipping to max_norm divides the gradients by: max(1, (norm + 1e-6) / max_norm), the
// reciprocal of clip_grad_norm_'s coefficient; 1 when the norm is non-finite (the gradients stay
// as they are, so the first bad parameter can be found); undefined when max_norm is infinite
// (clipping off: the update takes no grad_scale, whose CUDA kernel would write every gradient
// back). Given to the fused AdamW as grad_scale it clips inside the update.
torch::Tensor clip_divisor(const torch::Tensor& norm, double max_norm);
// `grads` times min(1, max_norm / (norm + 1e-6)) in place (not when the norm is non-finite, nor
// for an infinite max_norm); `norm` may live on another device than the gradients.
void scale_by_clip_coefficient(const std::vector<torch::Tensor>& grads, const torch::Tensor& norm,
                               double max_norm);
// gradient_norm, then scale_by_clip_coefficient: clip_grad_norm_ itself. Returns the norm.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& grads, double max_norm);

}  // namespace moe::optim
