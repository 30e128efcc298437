// Decoder-only transformer LM: token + learned position embeddings, L blocks of
// [RMSNorm -> causal self-attention] and [RMSNorm -> MoE FFN] with residuals, final RMSNorm,
// LM head (tied to the embedding by default).
#pragma once

#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/moe/moe_layer.h"

namespace moe::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t hidden, int64_t heads, double dropout, double init_std,
                          double out_init_std);
  torch::Tensor forward(const torch::Tensor& x);  // [B, S, d]
  torch::nn::Linear qkv{nullptr}, out{nullptr};

 private:
  int64_t heads_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

struct BlockOutput {
  torch::Tensor x;
  moe::MoeLayerOutput moe;
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const config::Config& cfg, const torch::Device& device);
  BlockOutput forward(const torch::Tensor& x);
  RMSNorm attn_norm{nullptr}, moe_norm{nullptr};
  CausalSelfAttention attn{nullptr};
  moe::MoeLayer moe{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(Block);

struct LmOutput {
  torch::Tensor logits;                          // [B, S, V]
  torch::Tensor aux_loss;                        // sum over layers (unweighted)
  torch::Tensor z_loss;                          // sum over layers (unweighted)
  std::vector<torch::Tensor> tokens_per_expert;  // per layer [E]
  int64_t dropped = 0;
};

class TransformerLMImpl : public torch::nn::Module {
 public:
  // `device`: where the model will run; it settles the MoE layers' kernel path (moe.kernels).
  explicit TransformerLMImpl(const config::Config& cfg,
                             const torch::Device& device = torch::Device(torch::kCPU));
  LmOutput forward(const torch::Tensor& tokens);  // [B, S] int64

  torch::nn::Embedding embed{nullptr}, pos_embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm final_norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

  // Once per optimizer step that updated the weights, with that step's tokens per expert per
  // MoE layer (summed over its micro-batches): each MoE layer's own bookkeeping (the routers'
  // aux-loss-free expert biases) stays inside the layer.
  void after_optimizer_step(const std::vector<torch::Tensor>& tokens_per_expert);
  // Blocks [0, n) recompute their activations in the backward (activation checkpointing).
  void set_checkpoint_blocks(int64_t n) { checkpoint_blocks_ = n; }

 private:
  config::ModelConfig mcfg_;
  int64_t checkpoint_blocks_ = 0;
};
TORCH_MODULE(TransformerLM);

}  // namespace moe::model
