// The two halves of a block, each a kind behind one small interface: the token mixer (what mixes
// positions: attention, latent attention, Gated DeltaNet; Mamba-2 is a kind to come) and the
// feed-forward (dense MLP or MoE). Each kind is one file that registers its module in the block
// under its parameter names and returns its interface; make_token_mixer / make_feed_forward
// pick the kind from the layer's spec.
#pragma once

#include <cstdint>
#include <memory>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/layers/lora.h"
#include "moe/model/decode_cache.h"
#include "moe/model/layer_spec.h"
#include "moe/model/rms_norm.h"
#include "moe/moe/moe_layer.h"

namespace moe::model {

class BlockImpl;
class RotaryTableCache;

class TokenMixer {
 public:
  virtual ~TokenMixer() = default;
  // x [B, S, d] (normed) -> [B, S, d], before the residual add.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Documents inside the window for the following forwards (undefined: one sequence).
  virtual void set_documents(const torch::Tensor& mask, const torch::Tensor& positions) = 0;
  virtual void share_rotary_tables(std::shared_ptr<RotaryTableCache> cache) = 0;
  virtual void merge_lora() = 0;
  // Generation (model/decode_cache.h): the following forwards run `step` against `cache` and
  // update it; null for both: the ordinary forward.
  virtual void set_decode(const DecodeStep* step, LayerCache* cache) = 0;
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // x [T, d] (normed, flattened) -> y [T, d] with the layer's MoE statistics (a dense kind
  // reports zero aux and z losses and an empty tokens_per_expert).
  virtual moe::MoeLayerOutput forward(const torch::Tensor& x) = 0;
  virtual void merge_lora() = 0;
  // true: forward() takes the residual itself [T, d], un-normed, and applies its own norms (the
  // parallel dense + MoE kind, whose router reads the residual).
  virtual bool takes_residual() const { return false; }
};

// What the kinds build from.
struct BlockContext {
  const config::Config& cfg;
  const torch::Device& device;
  int64_t layer;
  const moe::MoeParallel& parallel;
};

// The adapters' rank, scaling and dropout (none without LoRA).
layers::LoraSpec lora_spec(const config::Config& cfg);
// Our fused CUDA kernels for the block's elementwise ops (rotary, sinks, SwiGLU): on CUDA, with
// the kernels compiled and moe.kernels not `reference`. Not resolve_kernel_path: its errors are
// about the MoE layers' kernels (a dense model asking for "cuda" on the CPU is not refused for
// want of a rotary kernel).
bool fused_block_kernels(const BlockContext& ctx);
// A feed-forward's output without routing: zero aux and z losses, no tokens per expert.
moe::MoeLayerOutput no_routing(const torch::Tensor& y);
// One of the block's RMSNorms over the hidden width (model.norm_eps, model.zero_centered_norm).
RMSNorm hidden_norm(const config::Config& cfg);
// Residual-output projections' init std: init_std / sqrt(2 L) (GPT-2, Megatron).
double output_init_std(const config::Config& cfg);

// The kinds, one file each.
std::shared_ptr<TokenMixer> attention_mixer(BlockImpl& block, const BlockContext& ctx,
                                            const LayerSpec& spec);  // model/attention.cpp
std::shared_ptr<TokenMixer> gated_deltanet_mixer(BlockImpl& block,
                                                 const BlockContext& ctx);  // gated_deltanet.cpp
std::shared_ptr<TokenMixer> mamba2_mixer(BlockImpl& block,
                                         const BlockContext& ctx);  // model/mamba2_mixer.cpp
std::shared_ptr<FeedForward> dense_feed_forward(BlockImpl& block,
                                                const BlockContext& ctx);  // model/dense_mlp.cpp
std::shared_ptr<FeedForward> moe_feed_forward(BlockImpl& block,
                                              const BlockContext& ctx);  // moe_feed_forward.cpp
std::shared_ptr<FeedForward> parallel_feed_forward(
    BlockImpl& block, const BlockContext& ctx);  // model/parallel_feed_forward.cpp

// The spec's kinds, built into `block` (null for a kind kNone).
std::shared_ptr<TokenMixer> make_token_mixer(BlockImpl& block, const BlockContext& ctx,
                                             const LayerSpec& spec);
std::shared_ptr<FeedForward> make_feed_forward(BlockImpl& block, const BlockContext& ctx,
                                               const LayerSpec& spec);

}  // namespace moe::model
