// One decoder block, assembled from its layer's spec (model/layer_spec.h): [RMSNorm -> token
// mixer] and [RMSNorm -> feed-forward], each with a residual (model.sublayer_blocks: one of them);
// with model.sandwich_norms an RMSNorm on each output too, with model.layer_scalar the block's
// output times a scalar. The kinds sit behind the two interfaces of model/block_parts.h; the block
// never asks which family it belongs to.
#pragma once

#include <memory>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/model/attention.h"
#include "moe/model/block_parts.h"
#include "moe/model/dense_mlp.h"
#include "moe/model/gated_deltanet.h"
#include "moe/model/layer_spec.h"
#include "moe/model/mamba2_mixer.h"
#include "moe/model/rms_norm.h"
#include "moe/moe/moe_layer.h"

namespace moe::model {

struct BlockOutput {
  torch::Tensor x;
  moe::MoeLayerOutput moe;
};

class BlockImpl : public torch::nn::Module {
 public:
  // Layer `layer` of `cfg`: its token mixer and feed-forward as layer_spec(cfg, layer) says.
  BlockImpl(const config::Config& cfg, const torch::Device& device, int64_t layer,
            const moe::MoeParallel& parallel = {});
  // Dense layers report zero aux and z losses and an empty tokens_per_expert.
  BlockOutput forward(const torch::Tensor& x);
  bool is_moe() const { return !moe.is_empty(); }
  const LayerSpec& spec() const { return spec_; }
  // The documents of the following forwards (CausalSelfAttentionImpl::set_documents).
  void set_documents(const torch::Tensor& mask, const torch::Tensor& positions) {
    if (mixer_) mixer_->set_documents(mask, positions);
  }
  void share_rotary_tables(std::shared_ptr<RotaryTableCache> cache) {
    if (mixer_) mixer_->share_rotary_tables(std::move(cache));
  }
  void merge_lora();  // every adapter of the block folded into its base weight
  // Generation: the following forwards run `step` against the layer's `cache` (null: ordinary).
  void set_decode(const DecodeStep* step, LayerCache* cache) {
    if (mixer_) mixer_->set_decode(step, cache);
  }

  // The kinds' modules, by the names their parameters carry (blocks.N.attn., .linear_attn.,
  // .moe., .mlp.):
  // each is set by the kind that registers it (block_parts.h), the others stay null.
  RMSNorm attn_norm{nullptr}, moe_norm{nullptr};  // moe_norm: the feed-forward's norm
  // model.sandwich_norms: on the attention's and the feed-forward's outputs.
  RMSNorm attn_post_norm{nullptr}, ffn_post_norm{nullptr};
  // The parallel dense + MoE kind: the dense branch's pre- and post-norm, the experts' post-norm
  // (moe_norm is the experts' pre-norm).
  RMSNorm mlp_norm{nullptr}, mlp_post_norm{nullptr}, moe_post_norm{nullptr};
  torch::Tensor layer_scalar;  // [1], frozen (model.layer_scalar only)
  CausalSelfAttention attn{nullptr};
  GatedDeltaNet linear_attn{nullptr};  // Gated DeltaNet layers (blocks.N.linear_attn.)
  Mamba2Mixer mamba{nullptr};          // Mamba-2 layers (blocks.N.mamba.)
  moe::MoeLayer moe{nullptr};          // MoE layers
  DenseMlp mlp{nullptr};               // dense layers

 private:
  // A sublayer's output as its residual add takes it (times model.residual_multiplier).
  torch::Tensor scaled(const torch::Tensor& y) const {
    return residual_multiplier_ != 1.0 ? y * residual_multiplier_ : y;
  }
  LayerSpec spec_;
  std::shared_ptr<TokenMixer> mixer_;
  std::shared_ptr<FeedForward> feed_forward_;
  double dropout_;
  double residual_multiplier_;
};
TORCH_MODULE(Block);

}  // namespace moe::model
