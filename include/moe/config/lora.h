// What the "lora" section means for a model: which projections carry adapters, their scaling,
// which base modules train in full. One reading shared by the model, the planner and the
// exporters (docs/finetune.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moe/config/config.h"

namespace moe::config {

// PEFT's reading of target_modules on Mixtral / Qwen3-MoE / OLMoE under transformers >= 5,
// where each layer's experts hold two stacked parameters, gate_up_proj [E, 2f, d] and
// down_proj [E, d, f]: gate_proj + up_proj (Mixtral: w1 + w3) become one adapter on gate_up_proj
// of rank 2r and lora_alpha 2 alpha (the same scaling), down_proj (w2) one on down_proj;
// "gate_up_proj" names the rank-r adapter of target_parameters = ["mlp.experts.gate_up_proj"].
// The dense layers' MLPs (Qwen3-MoE's mlp_only_layers) are PEFT-invisible there; "dense_mlp"
// adapts them (export-hf --merge only).
struct LoraTargets {
  bool q = false, k = false, v = false, o = false;  // attention projections (MLA: q = q_proj)
  bool q_a = false, q_b = false, kv_a = false, kv_b = false;  // latent attention's (MLA)
  bool dense_mlp = false;                                     // dense layers' gate/up/down
  int64_t experts_gate_up_rank = 0;  // 0: no adapter on the experts' gate_up
  double experts_gate_up_alpha = 0;
  bool experts_down = false;
  // up_proj named without gate_proj: the adapter on non-gated (relu2) experts' up, rank r
  // (PEFT's target_parameters "experts.up_proj" on Nemotron-H).
  bool experts_up = false;
  bool in_proj = false;   // the Mamba-2 mixers' input projection
  bool out_proj = false;  // the output projection of the Mamba-2 and Gated DeltaNet mixers
  // Gated DeltaNet's input projections (Qwen3.5 splits them, Qwen3-Next fuses them).
  bool in_proj_qkv = false, in_proj_z = false, in_proj_b = false, in_proj_a = false;
  bool in_proj_qkvz = false, in_proj_ba = false;
  bool shared_expert_gate = false;  // the gated shared expert's d -> 1 gate (Qwen3-Next, 3.5)
};

bool lora_enabled(const Config& c);
LoraTargets lora_targets(const LoraConfig& l);
// lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT's rule).
double lora_scaling(const LoraConfig& l);
double lora_scaling(double alpha, int64_t r, bool rslora);

// Whether a parameter of ours (by name) is a LoRA adapter tensor.
bool is_lora_parameter(const std::string& name);
// Whether a base parameter trains in full next to the adapters (lora.modules_to_save).
bool saved_in_full(const LoraConfig& l, const std::string& name, bool tie_embeddings);

// Parameters (adapters + modules_to_save) and base parameters (frozen) of a LoRA config.
struct LoraParameterCounts {
  int64_t adapter = 0, trainable_base = 0, frozen_base = 0;
};
LoraParameterCounts lora_parameter_counts(const Config& c);

// The names accepted in lora.target_modules and lora.modules_to_save (the field lists' rules).
inline constexpr std::string_view kLoraTargetNames[] = {"q_proj",       "k_proj",
                                                        "v_proj",       "o_proj",
                                                        "gate_proj",    "up_proj",
                                                        "down_proj",    "w1",
                                                        "w3",           "w2",
                                                        "gate_up_proj", "dense_mlp",
                                                        "all-linear",   "q_a_proj",
                                                        "q_b_proj",     "kv_a_proj_with_mqa",
                                                        "kv_b_proj",    "in_proj",
                                                        "out_proj",     "in_proj_qkv",
                                                        "in_proj_z",    "in_proj_b",
                                                        "in_proj_a",    "in_proj_qkvz",
                                                        "in_proj_ba",   "shared_expert_gate"};
inline constexpr std::string_view kLoraSaveableNames[] = {
    "gate",   "lm_head", "embed_tokens", "norm", "input_layernorm", "post_attention_layernorm",
    "q_norm", "k_norm"};

}  // namespace moe::config
