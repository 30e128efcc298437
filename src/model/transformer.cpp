#include "moe/model/transformer.h"

#include "moe/config/parallel_dims.h"
#include "moe/kernels/permute.h"
#include "moe/kernels/rotary.h"
#include "moe/kernels/swiglu.h"
#include "moe/layers/profile_scope.h"
#include "moe/model/activation_checkpoint.h"
#include "moe/model/attention_core.h"
#include "moe/util/host_memory.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace moe::model {

namespace F = torch::nn::functional;

TransformerLMImpl::TransformerLMImpl(const config::Config& cfg, const torch::Device& device,
                                     const moe::MoeParallel& parallel)
    : mcfg_(cfg.model),
      checkpoint_blocks_(cfg.activation_checkpointing.number_checkpoints),
      checkpoints_on_host_(cfg.activation_checkpointing.cpu_checkpointing),
      eod_id_(cfg.data.reset_attention_at_eod ? cfg.data.eod_id : -1) {
  const auto& m = cfg.model;
  auto embedding = torch::nn::EmbeddingOptions(m.vocab_size, m.hidden_size);
  if (m.padding_idx >= 0) embedding.padding_idx(m.padding_idx);  // that row gets no gradient
  embed = register_module("embed", torch::nn::Embedding(embedding));
  if (config::learned_positions(cfg)) {  // rotary ones live in the attention
    pos_embed = register_module("pos_embed", torch::nn::Embedding(m.seq_len, m.hidden_size));
  }
  {
    torch::NoGradGuard g;
    embed->weight.normal_(0.0, m.init_std);
    if (m.padding_idx >= 0) embed->weight[m.padding_idx].zero_();  // as transformers initialises
    if (pos_embed) pos_embed->weight.normal_(0.0, m.init_std);
  }
  lora_ = config::lora_enabled(cfg);
  const config::ExpertRange held = config::expert_range(
      cfg.moe.num_experts, std::max<int64_t>(1, parallel.ep.size), parallel.ep.rank);
  expert_rows_ = {held.first, held.count, held.total};
  base_dtype_ = lora_ ? lora_base_dtype(cfg, device) : param_dtype(cfg);
  // moe.offload_experts: `auto` is settled before the model is built (train/expert_offload.h).
  experts_offloaded_ = lora_ && cfg.moe.offload_experts == config::OffloadExperts::kOn;
  // On a GPU each block goes to the device as soon as it is built (its frozen LoRA base in the
  // compute dtype): the host never holds the whole model, the device never its fp32 base.
  const bool to_device = device.is_cuda();
  auto list = register_module("blocks", torch::nn::ModuleList());  // names blocks.0, blocks.1...
  const auto shared_tables = std::make_shared<RotaryTableCache>();
  for (int64_t i = 0; i < m.num_layers; ++i) {
    blocks.push_back(Block(cfg, device, i, parallel));
    blocks.back()->share_rotary_tables(shared_tables);
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    if (lora_) freeze_for_lora(*blocks.back(), cfg, prefix);
    if (!lora_) hold_matrices_in_16_bits(*blocks.back(), prefix);
    if (config::quantized_base(cfg)) {
      quantize_frozen(blocks.back(), prefix, layers::quant_4bit_options(cfg, device), device);
      return_free_host_memory();  // the fp32 block's matrices: not kept by the C heap
    }
    offload_experts(blocks.back(), i, cfg, device);
    if (to_device) blocks.back()->to(device);
    list->push_back(blocks.back());
  }
  final_norm =
      register_module("final_norm", RMSNorm(m.hidden_size, m.norm_eps, m.zero_centered_norm));
  if (!m.tie_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(m.hidden_size, m.vocab_size).bias(false)));
    torch::NoGradGuard g;
    lm_head->weight.normal_(0.0, m.init_std);
  }
  if (lora_) freeze_for_lora(*this, cfg, "");
  if (!lora_) hold_matrices_in_16_bits(*this, "");
  if (to_device) this->to(device);  // the rest: embeddings, final norm, head
}

void TransformerLMImpl::hold_matrices_in_16_bits(torch::nn::Module& part,
                                                 const std::string& prefix) {
  if (base_dtype_ == torch::kFloat) return;
  torch::NoGradGuard no_grad;
  for (auto& item : part.named_parameters()) {
    auto& p = item.value();
    if (layers::is_16bit_matrix(prefix + item.key(), p) && p.scalar_type() != base_dtype_) {
      p.set_data(p.to(base_dtype_));
    }
  }
}

void TransformerLMImpl::freeze_for_lora(torch::nn::Module& part, const config::Config& cfg,
                                        const std::string& prefix) {
  // LoRA: the base is frozen (no gradient, so no optimizer state), except what
  // lora.modules_to_save names; its matrices live in base_dtype_.
  torch::NoGradGuard no_grad;
  for (auto& item : part.named_parameters()) {
    const std::string name = prefix + item.key();
    const bool trains = config::is_lora_parameter(name) ||
                        config::saved_in_full(cfg.lora, name, cfg.model.tie_embeddings);
    auto& p = item.value();
    p.requires_grad_(trains);
    if (layers::held_in_16_bits(name, p) && p.scalar_type() != base_dtype_)
      p.set_data(p.to(base_dtype_));
  }
}

void TransformerLMImpl::quantize_frozen(Block& block, const std::string& prefix,
                                        const layers::Quant4bitOptions& opt,
                                        const torch::Device& device) {
  torch::NoGradGuard no_grad;
  // Emptied, not removed: the parameter keeps its name (checkpoints, the fingerprint's order).
  auto quantize = [&](const std::string& name, torch::Tensor& p, layers::QuantizedWeightPtr& slot,
                      bool experts, std::vector<int64_t> rows = {}) {
    if (p.requires_grad()) return;  // trains in full (lora.modules_to_save)
    slot = experts ? layers::QuantizedWeight::experts(p, opt)
                   : layers::QuantizedWeight::linear(p, rows, opt);
    // The block moves with Module::to(), which does not see the 4-bit state; offloaded experts
    // stay in host memory (offload_experts()).
    if (!(experts && experts_offloaded_)) slot->to(device);
    quantized_[prefix + name] = slot;
    p.set_data(torch::empty({0}, p.options()));
  };
  if (!block->moe.is_empty()) {
    auto& e = *block->moe->experts;
    if (e.w_gate.defined()) quantize("moe.experts.w_gate", e.w_gate, e.gate_4bit, true);
    quantize("moe.experts.w_up", e.w_up, e.up_4bit, true);
    quantize("moe.experts.w_down", e.w_down, e.down_4bit, true);
  }
  if (opt.mxfp4) return;  // MXFP4: the experts only (transformers' Mxfp4Config)
  if (block->mlp) {
    auto& m = *block->mlp;
    if (m.gate_proj) quantize("mlp.gate_proj.weight", m.gate_proj->weight, m.gate_4bit, false);
    quantize("mlp.up_proj.weight", m.up_proj->weight, m.up_4bit, false);
    quantize("mlp.down_proj.weight", m.down_proj->weight, m.down_4bit, false);
  }
  if (block->linear_attn) {  // Gated DeltaNet's projections (split or fused; no biases)
    auto& g = *block->linear_attn;
    for (auto [name, linear, slot] :
         {std::tuple{"linear_attn.in_proj_qkv.weight", &g.in_proj_qkv, &g.in_proj_qkv_4bit},
          {"linear_attn.in_proj_z.weight", &g.in_proj_z, &g.in_proj_z_4bit},
          {"linear_attn.in_proj_b.weight", &g.in_proj_b, &g.in_proj_b_4bit},
          {"linear_attn.in_proj_a.weight", &g.in_proj_a, &g.in_proj_a_4bit},
          {"linear_attn.in_proj_qkvz.weight", &g.in_proj_qkvz, &g.in_proj_qkvz_4bit},
          {"linear_attn.in_proj_ba.weight", &g.in_proj_ba, &g.in_proj_ba_4bit},
          {"linear_attn.out_proj.weight", &g.out_proj, &g.out_proj_4bit}}) {
      if (!linear->is_empty()) quantize(name, (*linear)->weight, *slot, false);
    }
  }
  if (block->mamba && !block->mamba->options().proj_bias) {  // Nemotron-H's projections
    auto& mb = *block->mamba;
    quantize("mamba.in_proj.weight", mb.in_proj->weight, mb.in_proj_4bit, false);
    quantize("mamba.out_proj.weight", mb.out_proj->weight, mb.out_proj_4bit, false);
  }
  if (block->attn.is_empty()) return;
  auto& a = *block->attn;
  if (a.latent()) {
    for (auto [name, linear, slot] : {std::tuple{"attn.q_proj.weight", &a.q_proj, &a.q_proj_4bit},
                                      {"attn.q_a_proj.weight", &a.q_a_proj, &a.q_a_4bit},
                                      {"attn.q_b_proj.weight", &a.q_b_proj, &a.q_b_4bit},
                                      {"attn.kv_a_proj.weight", &a.kv_a_proj, &a.kv_a_4bit},
                                      {"attn.kv_b_proj.weight", &a.kv_b_proj, &a.kv_b_4bit},
                                      {"attn.out.weight", &a.out, &a.out_4bit}}) {
      if (!linear->is_empty()) quantize(name, (*linear)->weight, *slot, false);
    }
  }
  if (!a.latent()) {
    std::vector<int64_t> rows = {a.q_rows(), a.kv_rows()};  // q, k and v as three matrices
    if (a.v_rows() > 0) rows.push_back(a.v_rows());
    quantize("attn.qkv.weight", a.qkv->weight, a.qkv_4bit, false, rows);
    quantize("attn.out.weight", a.out->weight, a.out_4bit, false);
  }
}

void TransformerLMImpl::offload_experts(Block& block, int64_t layer, const config::Config& cfg,
                                        const torch::Device& device) {
  if (!experts_offloaded_ || block->moe.is_empty()) return;
  auto& experts = *block->moe->experts;
  if (experts.w_up.requires_grad()) return;  // trained in full (lora.modules_to_save)
  if (!expert_ring_) {
    expert_ring_ = std::make_shared<layers::OffloadRing>(cfg.moe.offload_ring_layers, device);
  }
  experts.offload_to(expert_ring_, layer);
}

int64_t TransformerLMImpl::quantized_bytes() const {
  int64_t b = 0;
  for (const auto& [name, q] : quantized_) b += q->bytes();
  return b;
}

void TransformerLMImpl::dequantize_base() {
  if (quantized_.empty()) return;
  torch::NoGradGuard no_grad;
  auto params = named_parameters();
  for (const auto& [name, q] : quantized_)
    params[name].set_data(q->dequantize(torch::kFloat).contiguous());
  for (auto& b : blocks) {
    if (!b->attn.is_empty()) {
      auto& a = *b->attn;
      a.qkv_4bit = a.out_4bit = a.q_proj_4bit = a.q_a_4bit = a.q_b_4bit = nullptr;
      a.kv_a_4bit = a.kv_b_4bit = nullptr;
    }
    if (b->mlp) b->mlp->gate_4bit = b->mlp->up_4bit = b->mlp->down_4bit = nullptr;
    if (!b->moe.is_empty()) {
      auto& e = *b->moe->experts;
      e.gate_4bit = e.up_4bit = e.down_4bit = nullptr;
    }
  }
  quantized_.clear();
}

BaseDtypeAutocast::BaseDtypeAutocast(const TransformerLM& model) {
  const auto dtype = model->base_dtype();
  on_ = dtype != torch::kFloat && !model->parameters().empty();
  if (!on_) return;
  device_type_ = model->parameters().front().device().type();
  was_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype);
}

BaseDtypeAutocast::~BaseDtypeAutocast() {
  if (!on_) return;
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

torch::ScalarType param_dtype(const config::Config& cfg) {
  switch (cfg.training.param_dtype) {
    case config::ParamDtype::kBf16:
      return torch::kBFloat16;
    case config::ParamDtype::kFp16:
      return torch::kHalf;
    case config::ParamDtype::kFp32:
      break;
  }
  return torch::kFloat;
}

torch::ScalarType lora_base_dtype(const config::Config& cfg, const torch::Device& device) {
  if (!device.is_cuda()) return torch::kFloat;
  if (cfg.bf16.enabled) return torch::kBFloat16;
  if (cfg.fp16.enabled) return torch::kHalf;
  return torch::kFloat;
}

void TransformerLMImpl::merge_lora() {
  dequantize_base();  // PEFT's merge over a 4-bit base: into the dequantized weights
  for (auto& b : blocks) b->merge_lora();
}

torch::Tensor TransformerLMImpl::head_weight() const {
  return lm_head ? lm_head->weight : embed->weight;
}

torch::Tensor TransformerLMImpl::head(const torch::Tensor& hidden) {
  auto logits = lm_head ? lm_head->forward(hidden) : F::linear(hidden, embed->weight);
  const double c = mcfg_.final_logit_softcapping;
  if (c > 0) logits = torch::tanh(logits / c) * c;  // Gemma's final_logit_softcapping
  return logits;
}

namespace {
// Gemma's scaled word embedding: times sqrt(hidden_size) rounded to the weights' dtype; Granite's
// times embedding_multiplier.
torch::Tensor scaled_embedding(const torch::Tensor& x, const config::ModelConfig& m) {
  auto y = x;
  if (m.scale_embeddings) {
    const double scale = std::sqrt(static_cast<double>(m.hidden_size));
    y = y * torch::scalar_tensor(scale, x.options());
  }
  return m.embedding_multiplier != 1.0 ? y * m.embedding_multiplier : y;
}

// The final norm's output as the head reads it: divided by Granite's logits_scaling, which is the
// logits divided by it (the chunked loss reads this hidden state too).
torch::Tensor head_input(const torch::Tensor& normed, const config::ModelConfig& m) {
  return m.logits_scaling != 1.0 ? normed / m.logits_scaling : normed;
}
}  // namespace

LmOutput TransformerLMImpl::forward(const torch::Tensor& tokens, bool logits) {
  LmOutput out;
  const int64_t S = tokens.size(1);
  torch::Tensor x;
  {
    layers::profile::Scope scope("embedding");
    DocumentLayout docs;
    if (eod_id_ >= 0) docs = document_layout(tokens, eod_id_);
    for (auto& b : blocks) b->set_documents(docs.mask, docs.positions);
    x = scaled_embedding(embed->forward(tokens), mcfg_);
    if (pos_embed) {
      x = x + (docs.positions.defined()
                   ? pos_embed->forward(docs.positions)
                   : pos_embed->forward(torch::arange(S, tokens.options())).unsqueeze(0));
    }
    // A 16-bit frozen base (LoRA) embeds in 16 bits; the residual stream stays fp32.
    if (x.scalar_type() != torch::kFloat) x = x.to(torch::kFloat);
    // A frozen embedding gives an input without a gradient; a checkpointed block's recompute
    // then would not reach the adapters inside it (HF's enable_input_require_grads).
    if (is_training() && torch::GradMode::is_enabled() && !x.requires_grad() &&
        checkpoint_blocks_ > 0) {
      x = x.detach().requires_grad_(true);
    }
  }
  out.aux_loss = torch::zeros({}, x.options().dtype(torch::kFloat));
  out.z_loss = torch::zeros({}, x.options().dtype(torch::kFloat));
  for (size_t i = 0; i < blocks.size(); ++i) {
    layers::profile::Layer layer(static_cast<int64_t>(i));
    // The first `checkpoint_blocks_` blocks keep only their input during training.
    BlockOutput bo = is_training() && static_cast<int64_t>(i) < checkpoint_blocks_ &&
                             torch::GradMode::is_enabled()
                         ? checkpointed_block_forward(blocks[i], x, checkpoints_on_host_)
                         : blocks[i]->forward(x);
    x = bo.x;
    out.aux_loss = out.aux_loss + bo.moe.aux_loss;
    out.z_loss = out.z_loss + bo.moe.z_loss;
    if (blocks[i]->is_moe()) out.tokens_per_expert.push_back(bo.moe.tokens_per_expert);
    out.dropped += bo.moe.dropped;
  }
  layers::profile::Scope scope("head");
  x = head_input(final_norm->forward(x), mcfg_);
  out.hidden = x;
  if (logits) out.logits = head(x);
  return out;
}

torch::Tensor TransformerLMImpl::decode(const torch::Tensor& tokens, const DecodeStep& step,
                                        std::vector<LayerCache>& caches) {
  caches.resize(blocks.size());
  // The blocks forget the step however this ends (an error leaves no block pointing at it).
  struct Detach {
    std::vector<Block>& blocks;
    ~Detach() {
      for (auto& b : blocks) b->set_decode(nullptr, nullptr);
    }
  } detach{blocks};
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i]->set_decode(&step, &caches[i]);
  auto x = scaled_embedding(embed->forward(tokens), mcfg_);
  if (pos_embed) x = x + pos_embed->forward(step.positions);
  if (x.scalar_type() != torch::kFloat) x = x.to(torch::kFloat);
  for (auto& b : blocks) x = b->forward(x).x;
  // Only the last position is sampled from: the head runs on it alone.
  x = head_input(final_norm->forward(x.narrow(1, x.size(1) - 1, 1)), mcfg_);
  return head(x).squeeze(1).to(torch::kFloat);
}

void TransformerLMImpl::after_optimizer_step(const std::vector<torch::Tensor>& tokens_per_expert) {
  size_t next = 0;  // tokens_per_expert holds MoE layers only
  for (auto& block : blocks) {
    if (!block->is_moe()) continue;
    if (next == tokens_per_expert.size()) break;
    block->moe->after_optimizer_step(tokens_per_expert[next++]);
  }
}

std::optional<TransformerLMImpl::ExpertRows> TransformerLMImpl::expert_rows(
    const std::string& name) const {
  if (expert_rows_.count == expert_rows_.total) return std::nullopt;
  if (name.find(".moe.experts.") == std::string::npos) return std::nullopt;
  return expert_rows_;
}

}  // namespace moe::model
