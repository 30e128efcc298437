#include "moe/model/block.h"

#include <torch/torch.h>

#include "moe/layers/profile_scope.h"

namespace moe::model {

namespace F = torch::nn::functional;

BlockImpl::BlockImpl(const config::Config& cfg, const torch::Device& device, int64_t layer,
                     const moe::MoeParallel& parallel)
    : spec_(layer_spec(cfg, layer)), dropout_(cfg.model.dropout) {
  const auto& m = cfg.model;
  const BlockContext ctx{cfg, device, layer, parallel};
  // Registration order is parameter order (checkpoints, the base fingerprint).
  attn_norm =
      register_module("attn_norm", RMSNorm(m.hidden_size, m.norm_eps, m.zero_centered_norm));
  mixer_ = make_token_mixer(*this, ctx, spec_);
  moe_norm = register_module("moe_norm", RMSNorm(m.hidden_size, m.norm_eps, m.zero_centered_norm));
  feed_forward_ = make_feed_forward(*this, ctx, spec_);
}

BlockOutput BlockImpl::forward(const torch::Tensor& x) {
  BlockOutput o;
  torch::Tensor h;
  {
    profile::Scope scope("attention");
    h = x + F::dropout(mixer_->forward(attn_norm->forward(x)),
                       F::DropoutFuncOptions().p(dropout_).training(is_training()));
  }
  const auto shape = h.sizes().vec();
  o.moe = feed_forward_->forward(moe_norm->forward(h).reshape({-1, shape.back()}));
  o.x = h + F::dropout(o.moe.y.view(shape),
                       F::DropoutFuncOptions().p(dropout_).training(is_training()));
  return o;
}

void BlockImpl::merge_lora() {
  mixer_->merge_lora();
  feed_forward_->merge_lora();
}

}  // namespace moe::model
