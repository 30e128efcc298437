// The attention token mixers: causal self-attention (grouped-query, with its options: q/k norms,
// biases, sinks, sliding windows, partial rotary) and multi-head latent attention
// (model/latent_attention.cpp), their rotary embeddings and the document masks of packed
// windows. Both are one module, CausalSelfAttention, registered as a block's "attn".
#pragma once

#include <memory>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
#include "moe/model/decode_cache.h"
#include "moe/model/rms_norm.h"

namespace moe::model {

struct AttentionOptions {
  int64_t hidden = 0, heads = 1;
  int64_t kv_heads = 1;  // grouped-query attention: heads / kv_heads query heads share one
  int64_t head_dim = 0;
  double rope_theta = 0;  // > 0: rotary embeddings on q and k (Hugging Face's rotate-half layout)
  config::RopeScalingConfig rope_scaling;  // linear / YaRN stretch of the rotary angles
  bool qk_norm = false;                    // RMSNorm on q and k before the rotation
  bool qk_norm_full = false;  // over all heads' width (OLMoE), else over head_dim (Qwen3-MoE)
  double clip_qkv = 0;        // > 0: clamp q, k, v to [-clip_qkv, clip_qkv] (OLMoE)
  bool bias = false;          // biases on qkv and out (gpt-oss)
  bool qkv_bias = false;      // biases on qkv only (GLM-4.5)
  int64_t rotary_dim = 0;     // rotary on the first rotary_dim of each head (GLM-4.5); 0 = all
  bool sinks = false;         // a learned logit per head in the softmax (gpt-oss)
  // Gated attention (Qwen3-Next / Qwen3.5): q's rows hold, per head, the query and then a gate;
  // the heads' output times sigmoid(gate) before the output projection.
  bool output_gate = false;
  bool zero_centered_norm = false;  // q/k norms times 1 + weight
  int64_t window = 0;               // > 0: sliding-window attention over this many positions
  double norm_eps = 1e-5;
  double dropout = 0, init_std = 0.02, out_init_std = 0.02;
  layers::LoraSpec lora;  // adapters on the projections lora_targets names
  config::LoraTargets lora_targets;
  // Rotary embedding by our fused CUDA kernel (moe/kernels/rotary.h) on CUDA tensors; else the
  // ATen reference `rotate`. The two are bitwise equal. Set from moe.kernels.
  bool fused_rotary = false;
  // Sinks through SDPA as an extra key (model/attention_core.h) on CUDA tensors; else the eager
  // ATen reference. Set from moe.kernels as fused_rotary.
  bool fused_attention = false;
  // Multi-head latent attention (model.kv_lora_rank > 0; model/latent_attention.cpp): q/k heads
  // of nope + rope dims, value heads of v_head_dim, head_dim and kv_heads unused.
  int64_t kv_lora_rank = 0, q_lora_rank = 0;  // q_lora_rank 0: one q_proj
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;  // rotary pairs (x0, x1), (x2, x3)... (DeepSeek, ERNIE 4.5)
  double softmax_scale = 0;      // > 0: in place of 1 / sqrt(q/k head width) (YaRN's mscale)
  // Gemma 4: no v projection, the values are k's projection before its norm and rotation
  // (model.attention_k_eq_v on a full-attention layer); a weightless RMSNorm on each value head.
  bool keys_are_values = false;
  bool value_norm = false;
};

// The rotary cos/sin tables of one forward, shared by every layer of a model (and by their
// recomputation under activation checkpointing): the first layer that asks computes them, the
// others reuse them. Keyed on what the tables depend on besides the forward's positions (which
// set_documents() clears the cache for): S, head_dim, theta, dtype, device, inference mode.
class RotaryTableCache {
 public:
  // The tables rotary_tables(x, theta, positions) would return.
  std::pair<torch::Tensor, torch::Tensor> get(const torch::Tensor& x, double theta,
                                              const torch::Tensor& positions,
                                              const config::RopeScalingConfig& scaling = {});
  void clear() { cos_ = sin_ = torch::Tensor(); }
  int64_t builds() const { return builds_; }  // tables computed so far (once per forward)

 private:
  torch::Tensor cos_, sin_;
  int64_t builds_ = 0;
  int64_t S_ = 0, hd_ = 0;
  double theta_ = 0;
  config::RopeScalingConfig scaling_;
};

// Causal self-attention: one fused projection to [q (heads) | k (kv_heads) | v (kv_heads)] x
// head_dim, SDPA, output projection. With heads == kv_heads, head_dim = hidden / heads and no
// rotary embedding, the layout and arithmetic are those of plain multi-head attention.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const AttentionOptions& opt);
  torch::Tensor forward(const torch::Tensor& x);  // [B, S, d]
  // Documents inside the window (data.reset_attention_at_eod) for the following forwards (and
  // their recomputation): mask [B, 1, S, S] bool (true = attend), positions [B, S] int64.
  // Undefined tensors: one causal sequence at positions 0..S-1.
  void set_documents(const torch::Tensor& mask, const torch::Tensor& positions) {
    doc_mask_ = mask;
    positions_ = positions;
    rotary_->clear();
  }
  // Generation (model/decode_cache.h): the following forwards take `step`'s new tokens, attend
  // over `cache` and append to it. Null: the ordinary forward.
  void set_decode(const DecodeStep* step, LayerCache* cache) {
    step_ = step;
    cache_ = cache;
    doc_mask_ = torch::Tensor();
    positions_ = step ? step->positions : torch::Tensor();
    rotary_->clear();
  }
  // Use `cache` for the rotary tables (a model shares one among its layers).
  void share_rotary_tables(std::shared_ptr<RotaryTableCache> cache) { rotary_ = std::move(cache); }
  const RotaryTableCache& rotary_table_cache() const { return *rotary_; }
  torch::nn::Linear qkv{nullptr}, out{nullptr};  // qkv: null with latent attention
  RMSNorm q_norm{nullptr}, k_norm{nullptr};      // qk_norm only
  // Latent attention's projections (HF's names; q_proj or q_a_proj/q_a_norm/q_b_proj).
  torch::nn::Linear q_proj{nullptr}, q_a_proj{nullptr}, q_b_proj{nullptr};
  torch::nn::Linear kv_a_proj{nullptr}, kv_b_proj{nullptr};
  RMSNorm q_a_norm{nullptr}, kv_a_norm{nullptr};
  layers::LoraAdapter lora_q_a{nullptr}, lora_q_b{nullptr}, lora_kv_a{nullptr}, lora_kv_b{nullptr};
  layers::QuantizedWeightPtr q_proj_4bit, q_a_4bit, q_b_4bit, kv_a_4bit, kv_b_4bit;
  torch::Tensor sinks;  // [H] (attention sinks only)
  layers::LoraAdapter lora_q{nullptr}, lora_k{nullptr}, lora_v{nullptr}, lora_o{nullptr};
  // A 4-bit frozen base (quantization.load_in_4bit): qkv's q, k and v and out, in place of the
  // emptied qkv / out weights.
  layers::QuantizedWeightPtr qkv_4bit, out_4bit;
  void merge_lora();  // folds the adapters into qkv / out and zeroes them
  bool latent() const { return opt_.kv_lora_rank > 0; }
  // The q part of qkv: H hd rows, 2 H hd with the output gate (query and gate per head).
  int64_t q_rows() const { return (opt_.output_gate ? 2 : 1) * opt_.heads * opt_.head_dim; }
  // The k rows of qkv, and its v rows (none where the keys are the values).
  int64_t kv_rows() const { return opt_.kv_heads * opt_.head_dim; }
  int64_t v_rows() const { return opt_.keys_are_values ? 0 : kv_rows(); }

 private:
  // x -> [B, S, q_rows() + 2 kv_heads head_dim]: the fused projection (4-bit or not) plus the
  // q/k/v adapters' updates on their rows.
  torch::Tensor project_qkv(const torch::Tensor& x);
  // Latent attention (model/latent_attention.cpp): its modules, forward and adapter merge.
  void build_latent();
  torch::Tensor forward_latent(const torch::Tensor& x);
  void merge_latent_lora();
  // This forward's keys and values joined to the cache and the mask over them (generation), or
  // k and v as they are with the ordinary masks.
  AttendedKeys attend(const torch::Tensor& k, const torch::Tensor& v);
  AttentionOptions opt_;
  torch::Tensor doc_mask_, positions_;
  const DecodeStep* step_ = nullptr;
  LayerCache* cache_ = nullptr;
  std::shared_ptr<RotaryTableCache> rotary_ = std::make_shared<RotaryTableCache>();
};

// Rotary position embedding of x [B, H, S, hd] at positions 0..S-1 (Hugging Face's layout:
// x * cos + rotate_half(x) * sin, frequencies theta^(-2i/hd) repeated over both halves).
// `positions` [B, S] int64 (optional): each token's position (restarting per document).
torch::Tensor apply_rotary(const torch::Tensor& x, double theta,
                           const torch::Tensor& positions = {},
                           const config::RopeScalingConfig& scaling = {});

// The rotary inverse frequencies [hd / 2] in fp32, as Hugging Face's rope_type default, linear
// and yarn compute them (same operations, same order: the same floats).
torch::Tensor rotary_inv_freq(int64_t hd, double theta, const config::RopeScalingConfig& scaling,
                              const torch::TensorOptions& options = {});
// The factor cos and sin are multiplied by: YaRN's attention_factor (given, or 0.1 ln(factor)
// + 1), 1 otherwise.
double rotary_attention_factor(const config::RopeScalingConfig& scaling);

// cos and sin of the rotary angles for tensors like x [B, H, S, hd]: [S, hd], or per document
// [B, 1, S, hd] with `positions` [B, S]. In fp32 as Hugging Face computes them, then in x's dtype.
std::pair<torch::Tensor, torch::Tensor> rotary_tables(
    const torch::Tensor& x, double theta, const torch::Tensor& positions = {},
    const config::RopeScalingConfig& scaling = {});
// The ATen reference of the rotation: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// Mistral Small 4's query scale 1 + beta ln(1 + floor(position / window)) for queries
// [B, H, S, d] at `positions` [B, S] (undefined: 0..S-1), [B or 1, 1, S, 1] in fp32 as
// transformers' get_llama_4_attn_scale; undefined when beta is 0 (no scaling).
torch::Tensor llama_4_query_scale(const torch::Tensor& q, const torch::Tensor& positions,
                                  const config::RopeScalingConfig& scaling);
// Interleaved rotary pairs (x0, x1), (x2, x3)... laid out as halves (x0, x2, ... | x1, x3, ...),
// where the rotate-half rotation turns each pair by its frequency: transformers'
// apply_rotary_pos_emb_interleave (DeepSeek-V3) and ERNIE 4.5's rotary do exactly this; V2's
// complex product rotates the same pairs. q and k are permuted alike, so every q.k is unchanged.
torch::Tensor pairs_as_halves(const torch::Tensor& x);

// The document structure of token windows [B, S] split at `eod` (the EOD token ends its
// document): mask [B, 1, S, S] (causal and within a document) and positions [B, S] restarting
// at 0 after each EOD. Megatron's get_ltor_masks_and_position_ids with both resets.
struct DocumentLayout {
  torch::Tensor mask, positions;
};
DocumentLayout document_layout(const torch::Tensor& tokens, int64_t eod);
TORCH_MODULE(CausalSelfAttention);

}  // namespace moe::model
