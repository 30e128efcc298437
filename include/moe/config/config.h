// The typed configuration tree. DeepSpeed key names where DeepSpeed has the concept
// (train_batch_size, optimizer, scheduler, fp16, bf16, gradient_clipping, ...); our own
// sections (model, moe, data, training, checkpoint, monitor) beside them. docs/config.md
// documents every key. Loaded once, overrides applied, validated once. Each struct's keys, with
// their JSON names, types and rules, are listed once in src/config/fields.h; members are named
// after their keys (objects like optimizer.params are flattened into their section's struct).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "moe/config/choices.h"

namespace moe::config {

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;  // Adam = AdamW with decoupled decay off
  double lr = 1e-3;                            // peak learning rate
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool decay_norms_and_biases = false;  // ours: DeepSpeed/Megatron skip them by default
  // Ours, after Megatron's precision-aware optimizer (--exp-avg-dtype / --exp-avg-sq-dtype):
  // fp32 (the fused update), bf16, or 8-bit blockwise as bitsandbytes' 8-bit Adam.
  StateDtype exp_avg_dtype = StateDtype::kFp32;
  StateDtype exp_avg_sq_dtype = StateDtype::kFp32;
  // Megatron's --main-params-dtype: the master weights of 16-bit working weights (fp32 in the
  // optimizer, or bf16 in the weights themselves plus a bf16 Kahan compensation).
  ParamDtype main_params_dtype = ParamDtype::kFp32;
};

// One struct for every scheduler type; which params are legal depends on `type`.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kWarmupCosineLR;
  // WarmupLR / WarmupDecayLR (absolute learning rates)
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // shared
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;  // 0: the run's total optimizer steps
  // WarmupCosineLR (ratios of optimizer.params.lr)
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // LinearWarmupCosineDecay (absolute)
  double min_lr = 0.0;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = true;
};

struct ZeroConfig {
  int64_t stage = 0;  // 0..1 are meaningful on one GPU; 2 and 3 are accepted with a warning
  OffloadOptimizerConfig offload_optimizer;
  // Data parallel (docs/distributed.md), in DeepSpeed's units: elements, not bytes.
  int64_t reduce_bucket_size = 6553600;     // gradient elements per reduction (25 MiB of fp32)
  int64_t allgather_bucket_size = 6553600;  // parameter elements per broadcast of updated shares
  bool overlap_comm = true;  // gradient reduction during the backward (DeepSpeed's default: false)
};

struct ActivationCheckpointingConfig {
  // DeepSpeed's switches other than number_checkpoints: read, and true warns (no effect here).
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  int64_t number_checkpoints = 0;  // 0 = no activation checkpointing
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct FlopsProfilerConfig {  // DeepSpeed's flops_profiler block
  bool enabled = false;
  int64_t profile_step = 1;   // the optimizer step (1-based) that is profiled
  int64_t module_depth = -1;  // 1: one row per module kind; -1 or >= 2: also one per layer
  int64_t top_modules = 1;    // the N slowest modules, listed first
  bool detailed = true;       // per-layer rows (unless module_depth is 1)
  std::string output_file;    // also written here; "" (or null) = the log only
};

struct MonitorSinkConfig {  // DeepSpeed's tensorboard / csv_monitor blocks
  bool enabled = false;
  std::string output_path = "";
  std::string job_name = "moe-train";
};

// Rotary scaling for windows past the pretraining one, as Hugging Face's rope_parameters
// (linear: positions divided by `factor`; yarn: YaRN's per-frequency blend and attention factor).
struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // the window's stretch
  int64_t original_max_position_embeddings = 0;  // yarn: the pretraining window
  double beta_fast = 32.0, beta_slow = 1.0;      // yarn: the ramp's bounds, in rotations
  double attention_factor = 0.0;                 // yarn: cos/sin scale; 0 = 0.1 ln(factor) + 1
  bool truncate = true;                          // yarn: the ramp's bounds rounded outward
  // yarn with multi-head latent attention (DeepSeek-V2/V3): the softmax scale times
  // (0.1 mscale_all_dim ln(factor) + 1)^2, as transformers' yarn_apply_mscale; 0 = unchanged.
  double mscale_all_dim = 0.0;
  // > 0: each query times 1 + beta ln(1 + floor(position / original_max_position_embeddings))
  // (Mistral Small 4's llama_4_scaling_beta: attention sharper past the pretraining window).
  double llama_4_scaling_beta = 0.0;
  // Not a config key: > 0 on a layer with proportional rotary (model.global_partial_rotary_factor)
  // only these many leading frequencies turn, the others are 0.
  int64_t rotating_pairs = 0;
  bool operator==(const RopeScalingConfig&) const = default;
};

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t seq_len = 128;
  int64_t hidden_size = 256;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  double dropout = 0.0;
  double init_std = 0.02;
  double norm_eps = 1e-5;
  bool tie_embeddings = true;
  // >= 0: the token whose embedding row is never trained (transformers' padding_idx, its
  // pad_token_id); -1: none.
  int64_t padding_idx = -1;
  double rope_theta = 0.0;          // > 0: rotary positions (HF convention); 0: learned positions
  RopeScalingConfig rope_scaling;   // rotary only
  int64_t num_key_value_heads = 0;  // grouped-query attention; 0 = num_heads (multi-head)
  int64_t head_dim = 0;             // 0 = hidden_size / num_heads
  bool qk_norm = false;             // RMSNorm on q and k before the rotation
  QkNormScope qk_norm_scope =
      QkNormScope::kHead;       // head: over head_dim (Qwen3-MoE); full: all heads (OLMoE)
  double clip_qkv = 0.0;        // > 0: clamp q, k, v to [-c, c] (OLMoE's clip_qkv)
  bool attention_bias = false;  // biases on the q, k, v and o projections (gpt-oss)
  bool qkv_bias = false;        // biases on q, k and v only (GLM-4.5's attention_bias)
  // Rotary on the first head_dim x factor dimensions of q and k, the rest passed through
  // (GLM-4.5: 0.5); HF's partial_rotary_factor.
  double partial_rotary_factor = 1.0;
  bool attention_sinks = false;  // a learned logit per head joined to the softmax (gpt-oss)
  int64_t sliding_window = 0;    // > 0: sliding_attention layers see this many keys (incl. self)
  // Per layer "full_attention" or "sliding_attention" (HF's layer_types); empty: every layer
  // sliding when sliding_window > 0, else full.
  std::vector<std::string> layer_types;
  int64_t dense_hidden_size = 0;  // dense FFN layers' width; 0 = as expert_hidden_size's rule
  std::string init_from;          // a moe-train checkpoint or Hugging Face directory to start from
  // The SDPA kernel torch tries first on CUDA (the others follow in torch's order, so a shape
  // the first cannot run still runs); auto = torch's own order. No effect on CPU.
  AttentionBackend attention_backend = AttentionBackend::kAuto;
  // Multi-head latent attention (DeepSeek-V2/V3, Kimi, Moonlight; HF's names), on when
  // kv_lora_rank > 0: keys and values from a kv_lora_rank latent (kv_a_proj -> RMSNorm ->
  // kv_b_proj) plus one rotary key of qk_rope_head_dim shared by the heads; queries through a
  // q_lora_rank bottleneck (0 = one q_proj). q/k heads are qk_nope_head_dim + qk_rope_head_dim
  // wide, value heads v_head_dim; head_dim and num_key_value_heads do not apply.
  int64_t kv_lora_rank = 0;
  int64_t q_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // The rotary dimensions in interleaved pairs (x0, x1), (x2, x3)... (DeepSeek's checkpoints;
  // HF's rope_interleave, always so in DeepseekV2), instead of the two halves.
  bool rope_interleave = false;
  // RMSNorm weights stored zero-centred: x_normed * (1 + w), initialised to 0 (Qwen3-Next /
  // Qwen3.5's block, final and q/k norms; Gemma's layout).
  bool zero_centered_norm = false;
  // Gated attention (Qwen3-Next / Qwen3.5): q_proj gives, per head, the query and then an output
  // gate of head_dim; the attention output is multiplied by sigmoid(gate) before o_proj.
  bool attention_output_gate = false;
  // Gated DeltaNet linear attention (model/gated_deltanet.cpp), the mixer of the layers that
  // layer_types marks "linear_attention" (HF's names).
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;  // a multiple of linear_num_key_heads
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 4;
  // The input projections fused per key-head group as Qwen3-Next saves them (in_proj_qkvz,
  // in_proj_ba); false: split as Qwen3.5 saves them (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).
  bool linear_fused_projections = false;
  // Gemma 4's attention and block. Full-attention layers (model.layer_types "full_attention")
  // may have their own head width, key/value heads and rotary; 0 = the sliding layers' value.
  int64_t global_head_dim = 0;
  int64_t global_num_key_value_heads = 0;
  double global_rope_theta = 0.0;
  // Proportional rotary on full-attention layers: the first factor x head_dim / 2 frequencies
  // theta^(-2i / head_dim) turn, the rest are 0 (transformers' rope_type "proportional").
  double global_partial_rotary_factor = 1.0;
  bool attention_k_eq_v = false;  // full-attention layers: no v projection, V = k's projection
  bool value_norm = false;        // a weightless RMSNorm over each value head
  double attention_scale = 0.0;   // > 0: the softmax scale in place of 1 / sqrt(head_dim)
  bool scale_embeddings = false;  // embeddings times sqrt(hidden_size), in the weights' dtype
  double final_logit_softcapping = 0.0;  // > 0: logits = c tanh(logits / c)
  bool sandwich_norms = false;  // RMSNorms on the attention's and feed-forward's outputs too
  bool layer_scalar = false;    // each block's output times a frozen per-layer scalar
  // Mamba-2 (SSD) mixers (model/mamba2_mixer.cpp) on the layers model.layer_types marks "mamba"
  // (Nemotron-H, Granite 4.0-H): mamba_num_heads heads of mamba_head_dim, B and C of
  // ssm_state_size in mamba_n_groups groups, a causal depthwise conv of mamba_conv_kernel over
  // x, B and C, the chunked scan in chunks of mamba_chunk_size.
  int64_t mamba_num_heads = 0;
  int64_t mamba_head_dim = 0;
  int64_t ssm_state_size = 0;
  int64_t mamba_n_groups = 1;
  int64_t mamba_conv_kernel = 4;
  int64_t mamba_chunk_size = 128;
  bool mamba_conv_bias = true;   // a bias on the conv (HF's use_conv_bias)
  bool mamba_proj_bias = false;  // biases on in_proj and out_proj (HF's use_bias)
  // The time step after softplus clamped to [mamba_dt_min, mamba_dt_max] (HF's
  // time_step_limit); mamba_dt_max 0 = unbounded.
  double mamba_dt_min = 0.0;
  double mamba_dt_max = 0.0;
  // Each block holds one sublayer (Nemotron-H's layers_block_type): layer_types "mamba" and
  // "full_attention" a token mixer only, "moe" and "mlp" a feed-forward only, each behind one
  // RMSNorm and a residual.
  bool sublayer_blocks = false;
  // Attention sees no positions at all: neither rotary nor learned (Nemotron-H's attention, and
  // Granite 4.0-H's position_embedding_type "nope"); needs rope_theta 0.
  bool no_position_encoding = false;
  // Granite's scales (GraniteMoeHybrid): the embeddings times embedding_multiplier, each block's
  // mixer and feed-forward outputs times residual_multiplier before their residual adds, the
  // logits divided by logits_scaling.
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double logits_scaling = 1.0;
};

struct MoeConfig {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t expert_hidden_size = 0;  // 0: 4 * hidden_size * 2 / 3 rounded up to 64 (SwiGLU)
  ScoreFunction score_function = ScoreFunction::kSoftmax;
  bool normalize_topk = true;             // renormalise the k weights to sum to 1
  double aux_loss_coeff = 0.01;           // Switch/GShard load-balancing loss
  double z_loss_coeff = 0.001;            // router z-loss
  double capacity_factor = 0.0;           // 0 = dropless
  double expert_dropout = 0.0;            // dropout on the experts' hidden activations (Switch)
  int64_t shared_expert_hidden_size = 0;  // > 0: a dense SwiGLU expert every token passes through
  // The shared expert's output times sigmoid(x . w), w a learned [1, hidden] (Qwen2/3-Next/3.5's
  // shared_expert_gate).
  bool shared_expert_gate = false;
  // > 0: the routed experts read and write this width (Nemotron 3 Super's LatentMoE): x is
  // projected d -> latent_size before the dispatch and the combined output back to d; the router
  // and the shared expert read x itself.
  int64_t latent_size = 0;
  double router_bias_update_rate = 0.0;  // > 0: aux-loss-free expert bias (DeepSeek-V3)
  // Group-limited routing (DeepSeek-V3, GLM-4.5: n_group, topk_group): the experts in n_group
  // equal groups; each token picks topk_group groups by the sum of their two best scores, then
  // its top_k experts within them. 1 = no groups.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // A group's score: the sum of its this many best keys (DeepSeek-V3, GLM-4.5: 2; DeepSeek-V2's
  // group_limited_greedy: 1, the group's best).
  int64_t group_score_experts = 2;
  double routed_scaling_factor = 1.0;      // the routed experts' weights times this (DeepSeek-V3)
  MoeKernels kernels = MoeKernels::kAuto;  // auto | cuda | reference
  // The routed rows' dtype through the dispatch: fp32 (the MoE layer's input as it is), or the
  // mixed-precision compute dtype the experts cast them to anyway (Megatron's and DeepSpeed's
  // bf16 rows: half the bytes for permute and the expert-parallel all-to-all).
  DispatchDtype dispatch_dtype = DispatchDtype::kFp32;
  // The grouped-GEMM experts' gate and up projections as one GEMM over [d, 2f] (Megatron's fc1)
  // with the SwiGLU on its packed output, where the weights are not bf16 already; false: two
  // GEMMs. No effect on the per-expert path.
  bool fused_gate_up = true;
  // Expert parallelism (docs/distributed.md): the experts spread over groups of this many ranks,
  // each holding num_experts / expert_parallel_size of them; 1 = every rank holds every expert.
  int64_t expert_parallel_size = 1;
  // The expert offload tier (layers/offload_ring.h): a LoRA run's frozen routed experts (16-bit
  // or 4-bit) live in host memory (pinned on a GPU) and each MoE layer's are copied into a ring
  // of offload_ring_layers device buffers, the next layer's ahead of compute on a side stream,
  // in the forward, the recomputation and the backward. auto: on where the plan says the run
  // does not fit the device without it and does with it (a GPU run only).
  OffloadExperts offload_experts = OffloadExperts::kAuto;
  int64_t offload_ring_layers = 2;
  // Which layers are MoE layers (Qwen3-MoE's rule): layer i is when i is not in mlp_only_layers
  // and (i + 1) % decoder_sparse_step == 0; the others are dense SwiGLU FFNs.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool router_bias = false;  // a learned bias on the router's logits (gpt-oss)
  // Top-k on the logits, then softmax over the k chosen (Megatron's default, gpt-oss), instead
  // of softmax over every expert before the top-k. Softmax scores only.
  bool softmax_after_topk = false;
  bool expert_bias = false;  // biases on each routed expert's gate, up and down (gpt-oss)
  ExpertActivation activation = ExpertActivation::kSwiglu;  // the routed experts' activation
  double swiglu_limit = 7.0;                                // clamped_swiglu's clamp
  double swiglu_alpha = 1.702;                              // clamped_swiglu's sigmoid slope
  // Gemma 4: every MoE layer also runs a dense MLP (model.dense_hidden_size) on the same input,
  // each with its own pre- and post-norms, and adds the two.
  bool parallel_dense = false;
  // Gemma 4's router: it reads the residual through a weightless RMSNorm times a learned
  // per-channel scale times hidden_size^-0.5, and scales the renormalised top-k weights by a
  // learned per-expert scale.
  bool router_input_norm = false;
  bool per_expert_scale = false;
};

// One source of a weighted blend (data.blend; docs/data-format.md "Blends").
struct BlendSource {
  std::string name;        // in logs, metrics and eval records; default: the path's last part
  std::string path;        // a prepare-data directory, an HDF5 shard or a directory of shards
  double weight = 1.0;     // > 0; the weights are normalised to sum to 1
  std::string valid_path;  // held-out shards of this source (raw shards; a dataset has "valid")
  bool operator==(const BlendSource&) const = default;
};

struct DataConfig {
  std::string path;               // dataset directory with manifest.json (prepare-data's output)
  std::string train_path;         // or: an HDF5 shard, or a directory of *.h5 shards
  std::string valid_path;         // same, for validation (only with train_path)
  bool verify_checksums = false;  // recompute md5/xxh3 of every shard before training
  bool shuffle = true;            // seeded per-epoch shuffle of blocks and windows
  int64_t prefetch = 4;           // batches prepared ahead of the trainer
  int64_t reader_threads = 1;     // concurrent block readers
  int64_t block_windows = 256;    // windows per contiguous read (the shuffle granularity)
  // Megatron's reset_attention_mask + reset_position_ids + eod_mask_loss: attention stays within
  // a document inside a window, positions restart after each end-of-document token, and the loss
  // at an EOD input (predicting across the boundary) is masked. Needs eod_id.
  bool reset_attention_at_eod = false;
  int64_t eod_id = -1;  // the end-of-document id (prepare-data --append-eod; manifest eod_id)
  std::vector<BlendSource> blend;  // a weighted blend instead of path/train_path
  // s3:// datasets: shards are fetched into this directory (default: OUTPUT_DIR/shard-cache),
  // at most cache_max_bytes of them at a time (least recently used evicted; 0 = unbounded).
  std::string cache_dir;
  int64_t cache_max_bytes = 0;
};

struct MonitorConfig {
  // The one exception to key names: the trainer reads these flat names.
  int64_t prometheus_port = 0;                // monitor.prometheus.port; 0 = no endpoint
  std::string prometheus_host = "127.0.0.1";  // monitor.prometheus.host
  double peak_tflops = 0.0;  // device peak for MFU; 0 = known GPUs only, none on CPU
};

struct DistributedConfig {  // ours: the data-parallel process group (docs/distributed.md)
  DistBackend backend = DistBackend::kAuto;  // auto (nccl on GPUs, gloo on CPUs) | gloo | nccl
  double timeout_s = 300;                    // rendezvous and every collective give up after this
};

struct CheckpointConfig {
  int64_t save_interval = 0;                // optimizer steps between checkpoints; 0 = off
  double save_interval_minutes = 0.0;       // wall-clock minutes between checkpoints; 0 = off
  int64_t keep_last = 3;                    // newest checkpoints kept
  int64_t keep_every = 0;                   // also keep every step that is a multiple; 0 = none
  bool save_initial = false;                // a checkpoint of the initial weights (step 0)
  bool save_final = true;                   // a checkpoint when training ends
  OnFailure on_failure = OnFailure::kStop;  // a failed write (disk full): stop (exit 3) or not
  std::string remote;             // s3://bucket/prefix: completed checkpoints mirrored there
  double remote_grace_s = 120.0;  // on SIGTERM: how long the final upload may take
};

// LoRA over a frozen base (docs/finetune.md), in PEFT's LoraConfig names. r = 0: no LoRA, every
// parameter trains.
struct LoraConfig {
  int64_t r = 0;              // adapter rank
  double lora_alpha = 8.0;    // scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)
  double lora_dropout = 0.0;  // dropout on the adapters' inputs
  // q_proj k_proj v_proj o_proj (attention); gate_proj + up_proj, down_proj (Mixtral: w1 + w3,
  // w2) or gate_up_proj: the experts, as PEFT reads them (config/lora.h); dense_mlp: the dense
  // layers' MLPs; "all-linear": attention and experts.
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  bool use_rslora = false;
  // Base modules that train in full next to the adapters (PEFT's suffix match): gate (the
  // routers), lm_head, embed_tokens, norm (every norm), input_layernorm, post_attention_layernorm,
  // q_norm, k_norm.
  std::vector<std::string> modules_to_save;
};

// A 4-bit frozen base under LoRA (QLoRA; docs/finetune.md), in transformers'
// BitsAndBytesConfig names: every attention and dense-MLP matrix and each expert's gate, up and
// down matrix are held as bitsandbytes' 4-bit blocks (64 values, fp32 absmax; double quant: the
// absmax 8-bit in blocks of 256) and dequantized to the compute dtype before each GEMM.
// Embeddings, norms, routers and the head stay 16-bit.
struct QuantizationConfig {
  bool load_in_4bit = false;
  Quant4bitType bnb_4bit_quant_type = Quant4bitType::kFp4;  // bitsandbytes' default
  bool bnb_4bit_use_double_quant = false;
  QuantComputeDtype bnb_4bit_compute_dtype = QuantComputeDtype::kFloat32;
  bool load_in_8bit = false;  // LLM.int8(): not supported (refused when true)
  // mxfp4: the routed experts' frozen matrices held in MXFP4 (32-value blocks of e2m1 with an
  // e8m0 scale; an MXFP4 checkpoint's own codes, as gpt-oss is released), the other matrices
  // 16-bit, as transformers' Mxfp4Config keeps attention, routers, embeddings and head.
  QuantMethod quant_method = QuantMethod::kBitsandbytes;
  // The largest slice of a 4-bit expert stack dequantized for one grouped GEMM, in MiB: a
  // larger stack is dequantized and multiplied a few experts at a time (one host sync per
  // projection for the row counts). 0 = the whole stack at once.
  int64_t dequant_scratch_mib = 0;
};

struct TrainingConfig {
  std::string output_dir = "runs/moe-train";
  int64_t train_iters = 0;  // optimizer steps; 0 = derive from epochs
  int64_t epochs = 1;       // used when train_iters is 0
  int64_t eval_interval = 100;
  int64_t eval_iters = 20;  // validation batches per evaluation
  uint64_t seed = 1234;
  TrainingDevice device = TrainingDevice::kAuto;
  int64_t max_bad_steps = 3;  // bf16/fp32: stop (exit 3) at this many non-finite steps in a row
  int64_t exit_interval = 0;  // Megatron's: checkpoint and exit 0 after steps divisible by it
  bool cuda_graph = false;    // capture the whole step in a CUDA graph (when eligible)
  // The LM head + cross-entropy this many tokens at a time, without the [tokens, vocab] logits
  // (train/chunked_lm_loss.h); 0 = the whole micro-batch at once.
  int64_t head_chunk_tokens = 0;
  // Every thread of the process on these CPUs: "" = the OS's placement, "auto" = the CPUs near
  // the run's GPU (its NUMA node), or a CPU list such as "0-7,16-23" (env/placement.h).
  std::string cpu_affinity;
  // The working weights' dtype: fp32 (autocast computes in bf16/fp16 from fp32 weights), or the
  // compute dtype itself (16-bit matrices, the fp32 master in the optimizer: DeepSpeed's bf16).
  ParamDtype param_dtype = ParamDtype::kFp32;
  double exit_duration_minutes = 0.0;  // checkpoint and exit 0 once this much time has passed
  // The torch profiler over steps [profile_step_start, profile_step_end) (1-based, Megatron's
  // --profile-step-start/end): a Chrome trace per rank and a table in the log. 0 = off; an end
  // of 0 = one step.
  int64_t profile_step_start = 0;
  int64_t profile_step_end = 0;
};

struct Config {
  // DeepSpeed batch triple, resolved by the any-two-of-three rule (world size 1).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  double gradient_clipping = 0.0;  // 0 = off (DeepSpeed's default)
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  ZeroConfig zero_optimization;
  ActivationCheckpointingConfig activation_checkpointing;
  MonitorSinkConfig tensorboard;
  MonitorSinkConfig csv_monitor;
  FlopsProfilerConfig flops_profiler;

  ModelConfig model;
  MoeConfig moe;
  DataConfig data;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  MonitorConfig monitor;
  DistributedConfig distributed;
  LoraConfig lora;
  QuantizationConfig quantization;

  // Not a key: data-parallel ranks, from the launcher (parallel/launch_env.h), set before
  // validate() (DeepSpeed's batch rule: train_batch_size = micro x accumulation x world size).
  int64_t world_size = 1;

  std::string source_file;            // where it came from, for messages; not serialised
  std::vector<std::string> warnings;  // accepted-but-ignored keys etc.; the CLI logs them
};

// Parses JSON text (file name used in messages). Throws UserError with line/column on syntax
// errors.
nlohmann::json parse_json_text(const std::string& text, const std::string& file,
                               const std::string& label = "config");
// `label` starts its error messages ("config", or "hf" for a model directory's JSON files).
nlohmann::json load_json_file(const std::string& path, const std::string& label = "config");

// Applies one `dotted.key=value` override. The value is parsed as JSON when it parses
// (numbers, true/false, null, arrays), else taken as a string. Type checking happens in from_json.
void apply_override(nlohmann::json& root, const std::string& assignment);

// Builds the typed tree: unknown keys (with did-you-mean), wrong types and names outside a
// closed set throw UserError.
Config from_json(const nlohmann::json& root, const std::string& file);

// Throws UserError "PREFIXpath = "value": expected one of NAMES"; PREFIX is "config: FILE: ".
[[noreturn]] void throw_not_a_choice(const std::string& prefix, std::string_view path,
                                     std::string_view value, const std::string& names);

// The enumerator named `value`; another value fails as it would in the config file at `path`.
template <Choice E>
E parse_choice(std::string_view value, std::string_view path, const std::string& file) {
  if (auto e = parse_choice<E>(value)) return *e;
  throw_not_a_choice("config: " + file + ": ", path, value, choice_list<E>());
}

// Range and consistency rules; resolves the batch triple. Throws UserError naming path and rule.
void validate(Config& cfg);

// Everything above in order: file -> overrides -> typed -> validated.
Config load(const std::string& path, const std::vector<std::string>& overrides);

// The resolved config with every default filled in, in the same key layout as the input.
nlohmann::json to_json(const Config& cfg);

// Derived sizes used by the model and messages.
int64_t expert_hidden_size(const Config& cfg);
// The width the routed experts read and write: moe.latent_size, or the hidden size without it.
int64_t expert_model_size(const Config& cfg);
int64_t head_dim(const Config& cfg);       // model.head_dim, or hidden_size / num_heads
bool latent_attention(const Config& cfg);  // MLA: model.kv_lora_rank > 0
// The width of a query/key head (MLA: qk_nope_head_dim + qk_rope_head_dim) and of a value head
// (MLA: v_head_dim); head_dim() for both otherwise.
int64_t qk_head_dim(const Config& cfg);
int64_t value_head_dim(const Config& cfg);
int64_t key_value_heads(const Config& cfg);           // model.num_key_value_heads, or num_heads
bool is_moe_layer(const Config& cfg, int64_t layer);  // moe.decoder_sparse_step, mlp_only_layers
int64_t moe_layer_count(const Config& cfg);
// Whether a LoRA run holds part of its frozen base quantized: quantization.load_in_4bit
// (bitsandbytes) or quant_method mxfp4 (the experts).
bool quantized_base(const Config& cfg);
// The keys a query of decoder block `layer` sees (model.sliding_window where the layer slides,
// per model.layer_types); 0 = every earlier position (full causal attention).
int64_t attention_window(const Config& cfg, int64_t layer);
// Whether decoder block `layer` mixes tokens by Gated DeltaNet (model.layer_types
// "linear_attention") instead of attention.
bool linear_attention_layer(const Config& cfg, int64_t layer);
// Whether decoder block `layer` mixes tokens by a Mamba-2 mixer (model.layer_types "mamba").
bool mamba_layer(const Config& cfg, int64_t layer);
// Whether block `layer` has a token mixer / a feed-forward: both, except under
// model.sublayer_blocks, where it has the one its layer_types entry names.
bool has_mixer(const Config& cfg, int64_t layer);
bool has_feed_forward(const Config& cfg, int64_t layer);
// Whether the MLPs and experts are gated (gate, up and down; SwiGLU, GeGLU) rather than an
// activation of up alone (moe.activation relu2: up and down only).
bool gated_mlp(const Config& cfg);
// Whether the model has learned absolute positions (model.rope_theta 0 without
// model.no_position_encoding).
bool learned_positions(const Config& cfg);
// A Mamba-2 mixer's inner width (heads x head_dim) and its conv's channels (x, B and C).
int64_t mamba_inner_size(const Config& cfg);
int64_t mamba_conv_channels(const Config& cfg);
// Whether decoder block `layer` is a full-attention layer of a model whose layer_types name
// some ("full_attention"): where model.global_* apply.
bool global_attention_layer(const Config& cfg, int64_t layer);
// The head width and key/value heads of block `layer` (model.global_* on full-attention layers).
int64_t layer_head_dim(const Config& cfg, int64_t layer);
int64_t layer_key_value_heads(const Config& cfg, int64_t layer);
// Whether block `layer`'s attention has no v projection (model.attention_k_eq_v).
bool keys_are_values(const Config& cfg, int64_t layer);
int64_t dense_hidden_size(const Config& cfg);  // model.dense_hidden_size, or the SwiGLU rule
int64_t count_parameters(const Config& cfg);
// The parameters that stay fp32 under 16-bit working weights (training.param_dtype): the RMSNorm
// weights and the routers (the model's 16-bit matrices are every other parameter).
int64_t fp32_parameters_under_16bit_weights(const Config& cfg);
// Parameters of decoder block `layer` (attention, its norms, and the MoE or dense FFN).
int64_t layer_parameters(const Config& cfg, int64_t layer);

// Data parallelism as the trainer runs it (parallel/data_parallel.h) and the planner sizes it
// (memory_plan.h), decided once from the world size, ZeRO stage and overlap_comm
// (docs/distributed.md).
enum class GradientReduction {
  kNone,                     // one process
  kReducerInBackward,        // overlap_comm, ZeRO 0-1: c10d's DDP Reducer in the last backward
  kAllReduceAfterBackward,   // overlap_comm false: bucketed all-reduce after the backward
  kReduceToOwnersInBackward  // overlap_comm, ZeRO 2: each bucket sum-reduced onto its owners
};
struct DataParallelMode {
  int64_t world_size = 1;
  int64_t zero_stage = 0;  // in effect: 0 on one process
  GradientReduction reduction = GradientReduction::kNone;
  // moe.expert_parallel_size in effect (1 on one process): the routed experts' gradients are
  // reduced over their expert-data-parallel group, the rest over the world, after the backward.
  int64_t expert_parallel = 1;
  bool distributed() const { return world_size > 1; }
  bool shards_optimizer() const { return zero_stage >= 1; }  // ZeRO-1: owners keep Adam state
  bool shards_gradients() const { return zero_stage >= 2; }  // ZeRO-2: owners keep gradients
};
DataParallelMode data_parallel_mode(const Config& cfg, int64_t world_size);
// DeepSpeed counts zero_optimization's bucket sizes in elements; ours hold fp32.
int64_t reduce_bucket_bytes(const Config& cfg);
int64_t allgather_bucket_bytes(const Config& cfg);

// One module kind as the flops profiler and MFU count it: its parameters and its forward FLOPs
// per token (a multiply-add is 2; forward + backward = 3 x forward), for one occurrence; `count`
// occurrences (1 for embedding and head, the number of layers of its kind otherwise). Attention
// scores count the full S x S square (PaLM's convention), or with `causal_half` the lower
// triangle a causal kernel computes (the convention of FlashAttention's and torchtitan's
// numbers). params x count over all kinds adds up to count_parameters().
struct ModuleCost {
  std::string name;  // embedding, attention, router, dispatch, experts, combine, dense_ffn, head
  int64_t count = 1;
  int64_t params = 0;
  double forward_flops_per_token = 0;
};
std::vector<ModuleCost> module_costs(const Config& cfg, bool causal_half = false);
// Forward + backward FLOPs per token of the whole model: 3 x the sum of module_costs. The one
// formula behind the trainer's MFU, the flops profiler and bench/run (which reads the trainer's
// records).
double training_flops_per_token(const Config& cfg, bool causal_half = false);
int64_t active_parameters_per_token(const Config& cfg);

}  // namespace moe::config
