// What one layer of a model is: its token mixer, its feed-forward and the options that differ
// between layers. A block is assembled from this (model/block.h); adding a kind adds an entry
// here and its file, never a branch on a family's name.
#pragma once

#include <cstdint>

#include "moe/config/config.h"

namespace moe::model {

// The token mixer: attention (grouped-query with its options; model/attention.cpp),
// multi-head latent attention (model/latent_attention.cpp) or Gated DeltaNet linear attention
// (model/gated_deltanet.cpp).
enum class MixerKind { kAttention, kLatentAttention, kGatedDeltaNet };
// The feed-forward: a dense SwiGLU MLP (model/dense_mlp.cpp), the MoE layer
// (model/moe_feed_forward.cpp), or both side by side on the same residual (moe.parallel_dense,
// Gemma 4; model/parallel_feed_forward.cpp).
enum class FeedForwardKind { kDense, kMoe, kParallelDenseMoe };

struct LayerSpec {
  MixerKind mixer = MixerKind::kAttention;
  FeedForwardKind feed_forward = FeedForwardKind::kMoe;
  int64_t attention_window = 0;  // > 0: sliding-window attention over this many positions
};

// Layer `layer` of `cfg`: Gated DeltaNet where model.layer_types says "linear_attention", else
// latent attention where model.kv_lora_rank says; MoE where
// config::is_moe_layer says, the window of config::attention_window.
LayerSpec layer_spec(const config::Config& cfg, int64_t layer);

const char* name(MixerKind kind);        // "attention", "latent_attention", "gated_deltanet"
const char* name(FeedForwardKind kind);  // "dense", "moe"

}  // namespace moe::model
