// What one layer of a model is: its token mixer, its feed-forward and the options that differ
// between layers. A block is assembled from this (model/block.h); adding a kind adds an entry
// here and its file, never a branch on a family's name.
#pragma once

#include <cstdint>

#include "moe/config/config.h"

namespace moe::model {

// The token mixer: attention (grouped-query with its options; model/attention.cpp),
// multi-head latent attention (model/latent_attention.cpp), Gated DeltaNet linear attention
// (model/gated_deltanet.cpp), a Mamba-2 mixer (model/mamba2_mixer.cpp), or none (a
// feed-forward-only block, model.sublayer_blocks).
enum class MixerKind { kAttention, kLatentAttention, kGatedDeltaNet, kMamba2, kNone };
// The feed-forward: a dense MLP (model/dense_mlp.cpp), the MoE layer
// (model/moe_feed_forward.cpp), both side by side on the same residual (moe.parallel_dense,
// Gemma 4; model/parallel_feed_forward.cpp), or none (a mixer-only block).
enum class FeedForwardKind { kDense, kMoe, kParallelDenseMoe, kNone };

struct LayerSpec {
  MixerKind mixer = MixerKind::kAttention;
  FeedForwardKind feed_forward = FeedForwardKind::kMoe;
  int64_t attention_window = 0;  // > 0: sliding-window attention over this many positions
};

// Layer `layer` of `cfg`: Gated DeltaNet where model.layer_types says "linear_attention", Mamba-2
// where it says "mamba", else latent attention where model.kv_lora_rank says; MoE where
// config::is_moe_layer says, the window of config::attention_window; under
// model.sublayer_blocks only the sublayer its entry names.
LayerSpec layer_spec(const config::Config& cfg, int64_t layer);

const char* name(MixerKind kind);        // "attention", "latent_attention", "gated_deltanet"...
const char* name(FeedForwardKind kind);  // "dense", "moe"...

}  // namespace moe::model
