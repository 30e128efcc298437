#include "moe/model/block.h"

#include <torch/torch.h>

#include "moe/layers/profile_scope.h"

namespace moe::model {

namespace F = torch::nn::functional;

BlockImpl::BlockImpl(const config::Config& cfg, const torch::Device& device, int64_t layer,
                     const moe::MoeParallel& parallel)
    : spec_(layer_spec(cfg, layer)),
      dropout_(cfg.model.dropout),
      residual_multiplier_(cfg.model.residual_multiplier) {
  const auto& m = cfg.model;
  const BlockContext ctx{cfg, device, layer, parallel};
  // Registration order is parameter order (checkpoints, the base fingerprint); the block's own
  // tensor comes first whatever the order.
  if (m.layer_scalar) layer_scalar = register_parameter("layer_scalar", torch::ones({1}), false);
  if (spec_.mixer != MixerKind::kNone) {
    attn_norm = register_module("attn_norm", hidden_norm(cfg));
    mixer_ = make_token_mixer(*this, ctx, spec_);
    if (m.sandwich_norms) attn_post_norm = register_module("attn_post_norm", hidden_norm(cfg));
  }
  if (spec_.feed_forward != FeedForwardKind::kNone) {
    moe_norm = register_module("moe_norm", hidden_norm(cfg));
    feed_forward_ = make_feed_forward(*this, ctx, spec_);
    if (m.sandwich_norms) ffn_post_norm = register_module("ffn_post_norm", hidden_norm(cfg));
  }
}

BlockOutput BlockImpl::forward(const torch::Tensor& x) {
  BlockOutput o;
  torch::Tensor h = x;
  if (mixer_) {
    layers::profile::Scope scope("attention");
    auto a = mixer_->forward(attn_norm->forward(x));
    if (attn_post_norm) a = attn_post_norm->forward(a);
    h = x + scaled(F::dropout(a, F::DropoutFuncOptions().p(dropout_).training(is_training())));
  }
  const auto shape = h.sizes().vec();
  if (!feed_forward_) {  // a mixer-only block (model.sublayer_blocks)
    o.moe = no_routing(torch::zeros({0, shape.back()}, h.options()));
    o.x = layer_scalar.defined() ? h * layer_scalar : h;
    return o;
  }
  o.moe = feed_forward_->forward(feed_forward_->takes_residual()
                                     ? h.reshape({-1, shape.back()})
                                     : moe_norm->forward(h).reshape({-1, shape.back()}));
  auto y = o.moe.y.view(shape);
  if (ffn_post_norm) y = ffn_post_norm->forward(y);
  o.x = h + scaled(F::dropout(y, F::DropoutFuncOptions().p(dropout_).training(is_training())));
  if (layer_scalar.defined()) o.x = o.x * layer_scalar;
  return o;
}

void BlockImpl::merge_lora() {
  if (mixer_) mixer_->merge_lora();
  if (feed_forward_) feed_forward_->merge_lora();
}

}  // namespace moe::model
