#include "moe/model/layer_spec.h"

namespace moe::model {

LayerSpec layer_spec(const config::Config& cfg, int64_t layer) {
  LayerSpec s;
  s.mixer = !config::has_mixer(cfg, layer)               ? MixerKind::kNone
            : config::linear_attention_layer(cfg, layer) ? MixerKind::kGatedDeltaNet
            : config::mamba_layer(cfg, layer)            ? MixerKind::kMamba2
            : config::latent_attention(cfg)              ? MixerKind::kLatentAttention
                                                         : MixerKind::kAttention;
  s.feed_forward = !config::has_feed_forward(cfg, layer) ? FeedForwardKind::kNone
                   : !config::is_moe_layer(cfg, layer)   ? FeedForwardKind::kDense
                   : cfg.moe.parallel_dense              ? FeedForwardKind::kParallelDenseMoe
                                                         : FeedForwardKind::kMoe;
  s.attention_window = config::attention_window(cfg, layer);
  return s;
}

const char* name(MixerKind kind) {
  switch (kind) {
    case MixerKind::kAttention:
      return "attention";
    case MixerKind::kLatentAttention:
      return "latent_attention";
    case MixerKind::kGatedDeltaNet:
      return "gated_deltanet";
    case MixerKind::kMamba2:
      return "mamba2";
    case MixerKind::kNone:
      return "none";
  }
  return "?";
}

const char* name(FeedForwardKind kind) {
  switch (kind) {
    case FeedForwardKind::kDense:
      return "dense";
    case FeedForwardKind::kMoe:
      return "moe";
    case FeedForwardKind::kParallelDenseMoe:
      return "parallel_dense_moe";
    case FeedForwardKind::kNone:
      return "none";
  }
  return "?";
}

}  // namespace moe::model
