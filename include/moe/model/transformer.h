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
#include "moe/layers/frozen_4bit.h"
#include "moe/model/block.h"
#include "moe/moe/moe_layer.h"

namespace moe::model {

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
  // Generation (model/decode_cache.h): `tokens` [B, S] run as `step` against `caches` (one per
  // block; empty ones fill on the first step) -> the logits of each row's last token [B, V].
  torch::Tensor decode(const torch::Tensor& tokens, const DecodeStep& step,
                       std::vector<LayerCache>& caches);
  // The head's weight [V, d]: lm_head's, or the embedding's when tied.
  torch::Tensor head_weight() const;
  // model.final_logit_softcapping (0: none): what a loss over head_weight() applies itself.
  double logit_softcap() const { return mcfg_.final_logit_softcapping; }
  // The logits of `hidden` [..., d] (the final norm's output): the head, then the soft cap.
  torch::Tensor head(const torch::Tensor& hidden);

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
  const std::map<std::string, layers::QuantizedWeightPtr>& quantized_weights() const {
    return quantized_;
  }
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
  // moe.offload_experts on (a LoRA run): the ring the MoE layers' frozen experts are fetched
  // through (layers/offload_ring.h); null when every expert lives on the device.
  const std::shared_ptr<layers::OffloadRing>& expert_ring() const { return expert_ring_; }

 private:
  // Freezes the base parameters of `part` (names under `prefix`) and casts its matrices to
  // base_dtype_.
  void freeze_for_lora(torch::nn::Module& part, const config::Config& cfg,
                       const std::string& prefix);
  // training.param_dtype: casts the matrices of `part` (trained) to base_dtype_.
  void hold_matrices_in_16_bits(torch::nn::Module& part, const std::string& prefix);
  // quantization.load_in_4bit: quantizes the frozen matrices of `block` and empties them.
  void quantize_frozen(Block& block, const std::string& prefix, const layers::Quant4bitOptions& opt,
                       const torch::Device& device);
  // moe.offload_experts on: block `layer`'s frozen routed experts join the ring (made here).
  void offload_experts(Block& block, int64_t layer, const config::Config& cfg,
                       const torch::Device& device);

  config::ModelConfig mcfg_;
  int64_t checkpoint_blocks_ = 0;
  bool checkpoints_on_host_ = false;  // activation_checkpointing.cpu_checkpointing
  int64_t eod_id_ = -1;               // >= 0: data.reset_attention_at_eod
  bool lora_ = false;
  ExpertRows expert_rows_;  // count < total: expert parallel
  std::string base_fingerprint_, base_source_;
  torch::ScalarType base_dtype_ = torch::kFloat;
  std::map<std::string, layers::QuantizedWeightPtr> quantized_;
  bool experts_offloaded_ = false;  // moe.offload_experts on, under LoRA
  std::shared_ptr<layers::OffloadRing> expert_ring_;
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
