// The attention of q, k, v after projection and rotation: scaled dot products, the causal (and
// document, and sliding-window) mask, softmax, the weighted sum of values. Two implementations
// of one contract:
//  - attention_reference: plain ATen, transformers' eager attention in its order of operations
//    (gpt-oss's eager_attention_forward with sinks): the CPU path and the oracle. It forms the
//    [B, H, S, S] scores.
//  - attention_sdpa: torch's scaled_dot_product_attention (flash / cuDNN / memory-efficient on
//    CUDA), which never forms the scores. Sinks become one extra key (below), so sinks and
//    sliding windows run on the same linear-memory kernels as plain causal attention.
#pragma once

#include <torch/types.h>

namespace moe::model {

struct AttentionMasking {
  torch::Tensor documents;  // [B, 1, S, S] bool (true = attend; causal within a document) or {}
  int64_t window = 0;       // > 0: a query sees the last `window` positions, itself included
  torch::Tensor sinks;      // [H] learned logits joined to each head's softmax, or {}
  double scale = 0;         // > 0: the softmax scale in place of 1 / sqrt(q's head width)
  // Generation with a cache (model/decode_cache.h): [B, 1, S, T] bool over the cached keys, in
  // place of the causal, document and window masks above.
  torch::Tensor cached = torch::Tensor();
};

// q [B, H, S, hd], k [B, H, T, hd], v [B, H, T, hv] (key/value heads already repeated; T = S
// unless m.cached is given), scale 1/sqrt(hd) unless m.scale says otherwise. Returns [B, H, S, hv].
// Dropout p on the attention probabilities where p > 0.
torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionMasking& m, double p);
torch::Tensor attention_sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionMasking& m, double p);

// The boolean mask [S, S] (or [B, 1, S, S] with documents) a query row may attend to: causal,
// within `window` where window > 0, within its document where documents are given. Undefined
// when plain causal attention needs none (no documents, no window).
torch::Tensor attention_mask(int64_t S, const AttentionMasking& m, const torch::Device& device);

}  // namespace moe::model
