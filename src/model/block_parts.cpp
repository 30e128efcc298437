#include "moe/model/block_parts.h"

#include <cmath>
#include <stdexcept>

#include "moe/config/lora.h"
#include "moe/kernels/permute.h"

namespace moe::model {

layers::LoraSpec lora_spec(const config::Config& cfg) {
  if (!config::lora_enabled(cfg)) return {};
  return {cfg.lora.r, config::lora_scaling(cfg.lora), cfg.lora.lora_dropout};
}

bool fused_block_kernels(const BlockContext& ctx) {
  return ctx.device.is_cuda() && ctx.cfg.moe.kernels != config::MoeKernels::kReference &&
         kernels::cuda_kernels_compiled();
}

moe::MoeLayerOutput no_routing(const torch::Tensor& y) {
  moe::MoeLayerOutput o;
  o.y = y;
  o.aux_loss = torch::zeros({}, y.options().dtype(torch::kFloat));
  o.z_loss = torch::zeros({}, y.options().dtype(torch::kFloat));
  o.tokens_per_expert = torch::zeros({0}, y.options().dtype(torch::kLong));
  return o;
}

RMSNorm hidden_norm(const config::Config& cfg) {
  const auto& m = cfg.model;
  return RMSNorm(m.hidden_size, m.norm_eps, m.zero_centered_norm);
}

double output_init_std(const config::Config& cfg) {
  return cfg.model.init_std / std::sqrt(2.0 * static_cast<double>(cfg.model.num_layers));
}

std::shared_ptr<TokenMixer> make_token_mixer(BlockImpl& block, const BlockContext& ctx,
                                             const LayerSpec& spec) {
  switch (spec.mixer) {
    case MixerKind::kAttention:
    case MixerKind::kLatentAttention:  // one module; AttentionOptions say which
      return attention_mixer(block, ctx, spec);
    case MixerKind::kGatedDeltaNet:
      return gated_deltanet_mixer(block, ctx);
    case MixerKind::kMamba2:
      return mamba2_mixer(block, ctx);
    case MixerKind::kNone:
      return nullptr;
  }
  throw std::logic_error("model: no token mixer of this kind");
}

std::shared_ptr<FeedForward> make_feed_forward(BlockImpl& block, const BlockContext& ctx,
                                               const LayerSpec& spec) {
  switch (spec.feed_forward) {
    case FeedForwardKind::kDense:
      return dense_feed_forward(block, ctx);
    case FeedForwardKind::kMoe:
      return moe_feed_forward(block, ctx);
    case FeedForwardKind::kParallelDenseMoe:
      return parallel_feed_forward(block, ctx);
    case FeedForwardKind::kNone:
      return nullptr;
  }
  throw std::logic_error("model: no feed-forward of this kind");
}

}  // namespace moe::model
