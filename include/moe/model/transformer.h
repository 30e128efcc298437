// Decoder-only transformer LM: token + learned position embeddings, L blocks of
// [RMSNorm -> causal self-attention] and [RMSNorm -> MoE FFN] with residuals, final RMSNorm,
// LM head (tied to the embedding by default).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/layers/lora.h"
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
  int64_t window = 0;         // > 0: sliding-window attention over this many positions
  double norm_eps = 1e-5;
  double dropout = 0, init_std = 0.02, out_init_std = 0.02;
  LoraSpec lora;  // adapters on the projections lora_targets names
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
  bool rope_interleave = false;  // rotary pairs (x0, x1), (x2, x3)... (DeepSeek's layout)
  double softmax_scale = 0;      // > 0: in place of 1 / sqrt(q/k head width) (YaRN's mscale)
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
  // Use `cache` for the rotary tables (a model shares one among its layers).
  void share_rotary_tables(std::shared_ptr<RotaryTableCache> cache) { rotary_ = std::move(cache); }
  const RotaryTableCache& rotary_table_cache() const { return *rotary_; }
  torch::nn::Linear qkv{nullptr}, out{nullptr};  // qkv: null with latent attention
  RMSNorm q_norm{nullptr}, k_norm{nullptr};      // qk_norm only
  // Latent attention's projections (HF's names; q_proj or q_a_proj/q_a_norm/q_b_proj).
  torch::nn::Linear q_proj{nullptr}, q_a_proj{nullptr}, q_b_proj{nullptr};
  torch::nn::Linear kv_a_proj{nullptr}, kv_b_proj{nullptr};
  RMSNorm q_a_norm{nullptr}, kv_a_norm{nullptr};
  LoraAdapter lora_q_a{nullptr}, lora_q_b{nullptr}, lora_kv_a{nullptr}, lora_kv_b{nullptr};
  QuantizedWeightPtr q_proj_4bit, q_a_4bit, q_b_4bit, kv_a_4bit, kv_b_4bit;
  torch::Tensor sinks;  // [H] (attention sinks only)
  LoraAdapter lora_q{nullptr}, lora_k{nullptr}, lora_v{nullptr}, lora_o{nullptr};
  // A 4-bit frozen base (quantization.load_in_4bit): qkv's q, k and v and out, in place of the
  // emptied qkv / out weights.
  QuantizedWeightPtr qkv_4bit, out_4bit;
  void merge_lora();  // folds the adapters into qkv / out and zeroes them
  bool latent() const { return opt_.kv_lora_rank > 0; }

 private:
  // Latent attention (model/latent_attention.cpp): its modules, forward and adapter merge.
  void build_latent();
  torch::Tensor forward_latent(const torch::Tensor& x);
  void merge_latent_lora();
  AttentionOptions opt_;
  torch::Tensor doc_mask_, positions_;
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

// The document structure of token windows [B, S] split at `eod` (the EOD token ends its
// document): mask [B, 1, S, S] (causal and within a document) and positions [B, S] restarting
// at 0 after each EOD. Megatron's get_ltor_masks_and_position_ids with both resets.
struct DocumentLayout {
  torch::Tensor mask, positions;
};
DocumentLayout document_layout(const torch::Tensor& tokens, int64_t eod);
TORCH_MODULE(CausalSelfAttention);

// A dense SwiGLU FFN (the non-MoE layers of Qwen3-MoE): down(silu(gate(x)) * up(x)), weights in
// nn.Linear's [out, in] layout.
class DenseMlpImpl : public torch::nn::Module {
 public:
  DenseMlpImpl(int64_t hidden, int64_t ffn, double init_std, double out_init_std,
               const LoraSpec& lora = {}, const config::LoraTargets& targets = {});
  torch::Tensor forward(const torch::Tensor& x);
  void merge_lora();
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  LoraAdapter lora_gate{nullptr}, lora_up{nullptr}, lora_down{nullptr};
  QuantizedWeightPtr gate_4bit, up_4bit, down_4bit;  // a 4-bit frozen base
  bool fused_swiglu = false;  // kernels/swiglu.h's fused op where the operands allow
};
TORCH_MODULE(DenseMlp);

struct BlockOutput {
  torch::Tensor x;
  moe::MoeLayerOutput moe;
};

class BlockImpl : public torch::nn::Module {
 public:
  // Layer `layer`: an MoE FFN or, where config::is_moe_layer says not, a dense one.
  BlockImpl(const config::Config& cfg, const torch::Device& device, int64_t layer,
            const moe::MoeParallel& parallel = {});
  // Dense layers report zero aux and z losses and an empty tokens_per_expert.
  BlockOutput forward(const torch::Tensor& x);
  bool is_moe() const { return !moe.is_empty(); }
  RMSNorm attn_norm{nullptr}, moe_norm{nullptr};  // moe_norm: the FFN's norm, dense or MoE
  CausalSelfAttention attn{nullptr};
  moe::MoeLayer moe{nullptr};  // MoE layers
  DenseMlp mlp{nullptr};       // dense layers

 private:
  double dropout_;
};
TORCH_MODULE(Block);

struct LmOutput {
  torch::Tensor logits;    // [B, S, V]; undefined when not asked for
  torch::Tensor hidden;    // [B, S, d] the head's input (after the final norm)
  torch::Tensor aux_loss;  // sum over layers (unweighted)
  torch::Tensor z_loss;    // sum over layers (unweighted)
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer (dense layers skipped) [E]
  int64_t dropped = 0;
};

class TransformerLMImpl : public torch::nn::Module {
 public:
  // `device`: where the model will run; it settles the MoE layers' kernel path (moe.kernels).
  // `parallel`: data and expert parallel: how the routers combine their expert counts over the
  // ranks, and which experts this rank holds.
  explicit TransformerLMImpl(const config::Config& cfg,
                             const torch::Device& device = torch::Device(torch::kCPU),
                             const moe::MoeParallel& parallel = {});
  // tokens [B, S] int64. logits = false stops at the head's input (out.hidden), for a loss that
  // applies the head itself (train/chunked_lm_loss.h).
  LmOutput forward(const torch::Tensor& tokens, bool logits = true);
  // The head's weight [V, d]: lm_head's, or the embedding's when tied.
  torch::Tensor head_weight() const;

  torch::nn::Embedding embed{nullptr}, pos_embed{nullptr};  // pos_embed: learned positions only
  std::vector<Block> blocks;
  RMSNorm final_norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

  // Once per optimizer step that updated the weights, with that step's tokens per expert per
  // MoE layer (in layer order, dense layers skipped) (summed over its micro-batches): each MoE
  // layer's own bookkeeping (the routers' aux-loss-free expert biases) stays inside the layer.
  void after_optimizer_step(const std::vector<torch::Tensor>& tokens_per_expert);
  // Blocks [0, n) recompute their activations in the backward (activation checkpointing).
  void set_checkpoint_blocks(int64_t n) { checkpoint_blocks_ = n; }
  // LoRA (lora.r > 0): whether the model carries adapters; its base weights' fingerprint once
  // the base is loaded (layers/lora.h), "" before.
  bool has_lora() const { return lora_; }
  // The dtype the model's matrices are held in: a LoRA base's (bf16/fp16 on a GPU under
  // bf16/fp16: lora_base_dtype()), or training.param_dtype's; else fp32.
  torch::ScalarType base_dtype() const { return base_dtype_; }
  const std::string& base_fingerprint() const { return base_fingerprint_; }
  const std::string& lora_base_source() const { return base_source_; }  // "" = random init
  void set_base(std::string fingerprint, std::string source) {
    base_fingerprint_ = std::move(fingerprint);
    base_source_ = std::move(source);
  }
  // Folds every adapter into its base weight (export-hf --merge): the function is unchanged.
  // A 4-bit base is dequantized first (to fp32 here; the exporter writes it in bf16).
  void merge_lora();
  // quantization.load_in_4bit: the frozen matrices held 4-bit, by parameter name (the
  // parameters themselves are empty). Empty without a 4-bit base.
  const std::map<std::string, QuantizedWeightPtr>& quantized_weights() const { return quantized_; }
  // Bytes of the 4-bit base (codes and statistics).
  int64_t quantized_bytes() const;
  // Puts the dequantized values back into the parameters (fp32) and drops the 4-bit states:
  // what an export merges adapters into.
  void dequantize_base();
  // Expert parallelism: the rows [first, first + count) of num_experts (`total`) this rank holds
  // of a routed-expert parameter (dim 0 is the expert); nullopt for any other parameter, and
  // for every one without expert parallelism. Checkpoints hold the whole tensors.
  struct ExpertRows {
    int64_t first = 0, count = 0, total = 0;
  };
  std::optional<ExpertRows> expert_rows(const std::string& name) const;

 private:
  // Freezes the base parameters of `part` (names under `prefix`) and casts its matrices to
  // base_dtype_.
  void freeze_for_lora(torch::nn::Module& part, const config::Config& cfg,
                       const std::string& prefix);
  // training.param_dtype: casts the matrices of `part` (trained) to base_dtype_.
  void hold_matrices_in_16_bits(torch::nn::Module& part, const std::string& prefix);
  // quantization.load_in_4bit: quantizes the frozen matrices of `block` and empties them.
  void quantize_frozen(Block& block, const std::string& prefix, const Quant4bitOptions& opt,
                       const torch::Device& device);

  config::ModelConfig mcfg_;
  int64_t checkpoint_blocks_ = 0;
  bool checkpoints_on_host_ = false;  // activation_checkpointing.cpu_checkpointing
  int64_t eod_id_ = -1;               // >= 0: data.reset_attention_at_eod
  bool lora_ = false;
  ExpertRows expert_rows_;  // count < total: expert parallel
  std::string base_fingerprint_, base_source_;
  torch::ScalarType base_dtype_ = torch::kFloat;
  std::map<std::string, QuantizedWeightPtr> quantized_;
};
TORCH_MODULE(TransformerLM);

// Forward passes of a model whose matrices are 16-bit (a LoRA base on a GPU, or
// training.param_dtype): autocast to that dtype on the model's device type (CUDA, or the CPU
// for a 16-bit CPU run) while alive; fp32 activations would not multiply with bf16 weights, and
// fp32-listed ops (softmax, norms' reductions) stay fp32. A no-op otherwise.
class BaseDtypeAutocast {
 public:
  explicit BaseDtypeAutocast(const TransformerLM& model);
  ~BaseDtypeAutocast();
  BaseDtypeAutocast(const BaseDtypeAutocast&) = delete;
  BaseDtypeAutocast& operator=(const BaseDtypeAutocast&) = delete;

 private:
  bool on_ = false, was_enabled_ = false;
  at::DeviceType device_type_ = at::kCUDA;
  at::ScalarType was_dtype_ = at::kHalf;
};

// The dtype a LoRA run holds its frozen base in on `device`: the compute dtype of a GPU run
// under bf16 or fp16 (2 bytes per parameter), else fp32 (CPU runs compute in fp32).
torch::ScalarType lora_base_dtype(const config::Config& cfg, const torch::Device& device);
// training.param_dtype as a scalar type.
torch::ScalarType param_dtype(const config::Config& cfg);

}  // namespace moe::model
