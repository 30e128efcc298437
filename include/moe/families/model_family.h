// A Hugging Face model family in one place: the model_type / architecture it reads and writes,
// its config.json keys mapped to our `model` / `moe` sections and back, its MoE tensors' names,
// what it refuses on export and its defaults. Each family is one file, src/families/*_family.cpp;
// the registry (all_families) is what import-hf, export-hf, the help texts and the docs read.
// docs/adding-a-family.md walks through one.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/families/hf_keys.h"
#include "moe/families/tensor_piece.h"

namespace moe::families {

// What an architecture may hold beyond the common core (RMSNorm, rotary GQA attention, softmax
// top-k SwiGLU experts). export-hf refuses a checkpoint that uses a feature its target family
// does not have, naming the families that do (export_features.cpp holds the key and test of each).
enum class Feature {
  kAttentionBias,        // q/k/v/o biases (model.attention_bias)
  kAttentionSinks,       // a learned sink logit per head
  kSlidingWindow,        // sliding-window attention layers
  kRouterBias,           // a bias on the router's logits
  kSoftmaxAfterTopk,     // top-k on the logits, softmax over the k
  kExpertBias,           // biases in the experts' projections
  kClampedSwiglu,        // an expert activation other than plain SwiGLU
  kQkNorm,               // RMSNorm on queries and keys
  kClipQkv,              // q, k, v clamped
  kDenseLayers,          // dense (non-MoE) feed-forward layers
  kLatentAttention,      // multi-head latent attention (model.kv_lora_rank)
  kRopeInterleave,       // rotary on interleaved pairs
  kGroupScoreBest1,      // expert groups scored by their single best expert
  kSharedExperts,        // shared experts every token passes through
  kSigmoidScores,        // a score function other than softmax
  kSelectionBias,        // an aux-loss-free selection bias (e_score_correction_bias)
  kExpertGroups,         // group-limited routing (n_group > 1)
  kRoutedScaling,        // routed weights times a scaling factor
  kQkvBias,              // q/k/v biases without an o bias
  kPartialRotary,        // rotary on a leading part of each head
  kLinearAttention,      // Gated DeltaNet layers (model.layer_types "linear_attention")
  kAttentionOutputGate,  // gated attention: sigmoid(gate) on each head's output
  kZeroCenteredNorm,     // RMSNorm weights stored zero-centred (x (1 + w))
  kSharedExpertGate,     // the shared expert's output times a sigmoid gate
  kQueryPositionScale,   // queries scaled past the pretraining window (llama_4_scaling_beta)
  // Gemma 4's attention and block, each a setting of its own:
  kGlobalAttention,   // full-attention layers' own head width, kv heads, rotary, K=V
  kValueNorm,         // a weightless RMSNorm on each value head
  kAttentionScale,    // a softmax scale other than 1 / sqrt(head_dim)
  kScaledEmbeddings,  // embeddings times sqrt(hidden_size)
  kLogitSoftcap,      // final logit soft-capping
  kSandwichNorms,     // norms on the attention's and feed-forward's outputs
  kLayerScalar,       // a per-layer output scalar
  kParallelDense,     // a dense MLP beside the experts in every MoE layer
  kRouterInputNorm,   // the router's own input norm and scale, per-expert output scales
  kGeglu,             // gelu_tanh(gate) * up in the MLPs and experts
  // Nemotron-H's:
  kMamba,           // Mamba-2 layers (model.layer_types "mamba")
  kSublayerBlocks,  // one sublayer per block (model.sublayer_blocks)
  kNoPositions,     // attention without position encoding
  kRelu2,           // non-gated relu(up)^2 MLPs and experts
  kLatentExperts,   // routed experts at a latent width (moe.latent_size; Nemotron 3 Super)
  // Granite's:
  kMultipliers,  // embedding, residual and logits multipliers
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // ---- names
  virtual const char* model_type() const = 0;    // transformers' model_type: "mixtral"
  virtual const char* architecture() const = 0;  // "MixtralForCausalLM"
  virtual const char* title() const = 0;         // how people name it: "Mixtral"
  virtual const char* releases() const = 0;      // what it loads: "Mixtral 8x7B, 8x22B"
  virtual bool has(Feature f) const = 0;
  // A tiny config.json of the family's shape (3 layers, 4 experts, vocab 320) that the registry
  // tests import, export and import again (tests/families/family_registry_test.cpp).
  virtual nlohmann::json tiny_config() const = 0;

  // ---- import: config.json -> our sections
  // The defaults the family's config class applies where config.json has no key.
  virtual double default_rope_theta() const { return 1e4; }
  virtual double default_partial_rotary_factor() const { return 0.0; }  // 0: none
  // The keys the family names its own way (experts, widths, norms, routing) into `model` and
  // `moe`, which already hold the common keys. `warnings` (may be null) gets what is not imported.
  virtual void read_config(const HfKeys& k, nlohmann::json& model, nlohmann::json& moe,
                           std::vector<std::string>* warnings) const = 0;

  // ---- export: our config -> config.json
  // How strongly this family claims `cfg` when export-hf names no --architecture: the highest
  // claim wins (0: not this family).
  virtual int claim(const config::Config& cfg) const = 0;
  // What the family needs of `cfg` beyond the features it lacks: UserError("KEY: why").
  virtual void check_export(const config::Config& cfg) const = 0;
  virtual bool writes_head_dim() const { return true; }
  // The keys the family writes its own way, over the common ones in `j`.
  virtual void write_config(const config::Config& cfg, nlohmann::json& j) const = 0;

  // ---- tensors
  // The tensors of MoE layer `i` ("model.layers.i." / "blocks.i."): router, experts, shared
  // experts. The default is the per-expert layout transformers 5 saves (mlp.experts.E.*_proj).
  virtual void moe_tensors(const config::Config& cfg, const std::string& hf_layer,
                           const std::string& our_layer, std::vector<TensorPiece>& out) const;
  // Where a layer's parts sit under "layers.i." (transformers' module paths): most families
  // "self_attn.", "mlp.", "input_layernorm"; Nemotron-H holds every sublayer as "mixer." behind
  // "norm". And the embedding and final norm under the model prefix.
  virtual const char* attention_module() const { return "self_attn."; }
  virtual const char* mamba_module() const { return "mamba."; }
  virtual const char* dense_mlp_module() const { return "mlp."; }
  virtual const char* input_norm() const { return "input_layernorm"; }
  virtual const char* embedding_tensor() const { return "embed_tokens.weight"; }
  virtual const char* final_norm_tensor() const { return "norm.weight"; }
  // PEFT's gate_up_proj adapter columns interleave gate and up (gpt-oss's fused layout).
  virtual bool interleaved_gate_up() const { return false; }
  // Where transformers 5 holds a layer's routed experts, as PEFT's target_parameters name them:
  // "mlp.experts." (most), "experts." (Gemma 4: beside the dense mlp).
  virtual const char* experts_module() const { return "mlp.experts."; }
  // transformers keeps the router (and its correction bias) fp32 in any dtype
  // (_keep_in_fp32_modules_strict), and so does an export.
  virtual bool router_kept_fp32() const { return false; }
  // Released weights hold multi-token-prediction layers past num_hidden_layers or under mtp.
  // (skipped).
  virtual bool has_mtp_layers() const { return false; }

  // ---- vision-language releases (Qwen3.5): the text model trains, the rest is carried through
  // The config.json object holding the text model's keys ("text_config"); null: the top level.
  virtual const char* text_config_key() const { return nullptr; }
  // The family of that text model, whose keys and tensors these are ("qwen3_5_moe_text").
  virtual const char* text_family() const { return nullptr; }
  // The prefix of the text model's tensors: "model." (a causal LM), "model.language_model.".
  virtual const char* hf_model_prefix() const { return "model."; }
  // The text model's module path in memory, which PEFT's adapter names follow: the prefix above
  // for most; Nemotron-H's checkpoints say "backbone." where transformers holds "model.".
  virtual const char* peft_model_prefix() const { return hf_model_prefix(); }
  // The output head's tensor: "lm_head.weight"; Mistral 3's wrapper:
  // "language_model.lm_head.weight".
  virtual const char* hf_head_name() const { return "lm_head.weight"; }
  // A tensor of the release that is not the text model's (the vision tower): not imported;
  // export-hf copies it from the imported directory.
  virtual bool carried_tensor(const std::string&) const { return false; }

 protected:
  // The default moe_tensors with the family's names: `block` holds router and experts,
  // experts' projections named gate / up / down.
  struct ExpertNames {
    const char* block = "mlp.";
    const char* gate = "gate_proj";
    const char* up = "up_proj";
    const char* down = "down_proj";
    const char* shared = "shared_experts.";  // Qwen2-MoE's family: "shared_expert."
  };
  // The routed experts saved fused, as transformers 5 holds them (Mistral Small 4, Gemma 4):
  // `experts` + "gate_up_proj" [E, 2f, d] (gate rows, then up), + "down_proj" [E, d, f].
  static void fused_expert_tensors(const config::Config& cfg, const std::string& experts,
                                   const std::string& our_layer, std::vector<TensorPiece>& out);
  void split_expert_tensors(const config::Config& cfg, const std::string& hf_layer,
                            const std::string& our_layer, const ExpertNames& names,
                            std::vector<TensorPiece>& out) const;
};

// Every family, in the order of their files' names.
const std::vector<const ModelFamily*>& all_families();
// The family named `name` (an architecture, "MixtralForCausalLM", or a model_type, "mixtral");
// UserError "<where> "NAME" is not supported: expected A, B or C" otherwise.
const ModelFamily& family_named(const std::string& name, const std::string& where);
// The family `cfg` is exported as when export-hf names none: the highest claim.
const ModelFamily& family_of(const config::Config& cfg);
// The keys every tiny_config shares: 3 layers of width 64, 4 query heads on 2 key/value heads,
// vocab 320, top-2.
nlohmann::json tiny_common_keys();
// "A, B or C" / "A and B" of the families' architectures (or model types), for messages.
std::string listed(const std::vector<const ModelFamily*>& families, bool model_types,
                   const char* last_joint);

// Refuses (UserError "KEY: only F has this among the families export-hf writes") the first
// feature `cfg` uses that `family` does not have.
void refuse_missing_features(const config::Config& cfg, const ModelFamily& family);

// Each file src/families/NAME_family.cpp defines `void register_NAME_family(std::vector<const
// ModelFamily*>&)`, adding its families; the build lists the files (families_files.inc), so a
// new family touches nothing else.

}  // namespace moe::families
