// The LM head and its cross-entropy in chunks of tokens (training.head_chunk_tokens): the
// [tokens, vocab] logits never exist whole. Each chunk's logits live only inside the forward,
// which also computes that chunk's gradients of the hidden states and the head weight (the
// softmax minus the one-hot target); the backward scales them by the incoming gradient. The same
// value and gradients as the head + masked_lm_loss (loss_targets.h), up to summation order:
// Liger's and Unsloth's fused linear cross-entropy, in ATen.
#pragma once

#include <torch/types.h>

#include "moe/train/loss_targets.h"

namespace moe::train {

// Mean next-token cross entropy over t's kept positions (0 when none is kept) of
// hidden [B * S, d] @ weight [V, d]^T, chunk_tokens rows at a time. The matrices are multiplied
// in the autocast dtype of hidden's device when autocast is on there (as the head's linear
// would be), else in weight's dtype; the softmax and the sums are fp32. softcap > 0: the logits
// are softcap tanh(logits / softcap) (Gemma's final_logit_softcapping), in fp32.
torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                              const LossTargets& t, int64_t chunk_tokens, double softcap = 0);

}  // namespace moe::train
