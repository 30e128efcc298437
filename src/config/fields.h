// The field lists: every key of every section, once, with its member and rule. Reading
// (from_json), the per-key rules of validate(), writing (to_json, so `config show` and the
// checkpoint's state.json) and key_specs() all walk these lists, so a new key is its member in
// config.h and one line here, plus its docs/config.md row and configs/schema.json entry (a test
// compares the schema with key_specs()).
//
// A walk V provides:
//   field(key, member, rule = {}, applies = true)  one key; `applies` false: not a key here
//   object(key, fn)                                a nested JSON object; fn visits its keys
//   ignored(key)                                   accepted, no meaning (DeepSpeed switches)
//   multi_gpu(key)                                 accepted with the multi-GPU warning
//   no_effect(key, reason)                         accepted with a warning giving the reason
//   refused(key, reason)                           an error giving the reason; a warning when
//                                                  disabled (false, or "enabled": false)
// The last three read the value as opaque JSON: any content is accepted inside it.
// The order is the reading and checking order: of several errors, the first met is reported.
#pragma once

#include <array>
#include <concepts>
#include <string_view>
#include <type_traits>

#include "field_types.h"
#include "moe/config/config.h"
#include "moe/config/deepspeed_keys.h"
#include "moe/config/lora.h"

namespace moe::config {

// `S` is section struct T, const or not (reading fills it, the other walks only look).
template <class S, class T>
concept Section = std::same_as<std::remove_const_t<S>, T>;

template <class V, class S>
void section(V& v, std::string_view key, S& s) {
  v.object(key, [&] { visit_fields(v, s); });
}

void visit_fields(auto& v, Section<OptimizerConfig> auto& o) {
  v.field("type", o.type);
  v.field("exp_avg_dtype", o.exp_avg_dtype);
  v.field("exp_avg_sq_dtype", o.exp_avg_sq_dtype);
  v.field("main_params_dtype", o.main_params_dtype);
  v.object("params", [&] {
    v.field("lr", o.lr, above(0));
    v.field("betas", o.betas, in_open(0, 1));
    v.field("eps", o.eps, above(0));
    v.field("weight_decay", o.weight_decay, at_least(0));
    v.field("decay_norms_and_biases", o.decay_norms_and_biases);
    v.ignored("torch_adam");  // DeepSpeed implementation switches: no meaning here
    v.ignored("adam_w_mode");
  });
}

void visit_fields(auto& v, Section<SchedulerConfig> auto& s) {
  v.field("type", s.type);
  // Which params a type takes (read after `type`); the others are unknown keys.
  using enum SchedulerType;
  const bool absolute = s.type == kWarmupLR || s.type == kWarmupDecayLR;
  const bool ratios = s.type == kWarmupCosineLR;
  const bool linear = s.type == kLinearWarmupCosineDecay;
  v.object("params", [&] {
    v.field("warmup_min_lr", s.warmup_min_lr, at_least(0), absolute);
    v.field("warmup_max_lr", s.warmup_max_lr, above(0), absolute);
    v.field("warmup_min_ratio", s.warmup_min_ratio, in(0, 1), ratios);
    v.field("cos_min_ratio", s.cos_min_ratio, in(0, 1), ratios);
    v.field("warmup_num_steps", s.warmup_num_steps, at_least(0), absolute || ratios || linear);
    v.field("warmup_type", s.warmup_type, {}, absolute || ratios);
    v.field("total_num_steps", s.total_num_steps, at_least(0, "0 = the run's length"),
            s.type == kWarmupDecayLR || ratios || linear);
    v.field("min_lr", s.min_lr, at_least(0), linear);
  });
}

void visit_fields(auto& v, Section<Fp16Config> auto& f) {
  v.field("enabled", f.enabled);
  v.field("loss_scale", f.loss_scale, at_least(0, "0 = dynamic"));
  v.field("initial_scale_power", f.initial_scale_power, in(0, 62));
  v.field("loss_scale_window", f.loss_scale_window, at_least(1));
  v.field("hysteresis", f.hysteresis, at_least(1));
  v.field("consecutive_hysteresis", f.consecutive_hysteresis);
  v.field("min_loss_scale", f.min_loss_scale, above(0));
  v.ignored("auto_cast");  // casts the model's inputs: here token ids, autocast does the rest
}

void visit_fields(auto& v, Section<Bf16Config> auto& b) { v.field("enabled", b.enabled); }

void visit_fields(auto& v, Section<OffloadOptimizerConfig> auto& o) {
  v.field("device", o.device);
  v.field("pin_memory", o.pin_memory);
}

void visit_fields(auto& v, Section<ZeroConfig> auto& z) {
  v.field("stage", z.stage, in(0, 3).says("must be 0, 1, 2 or 3"));
  section(v, "offload_optimizer", z.offload_optimizer);
  v.field("reduce_bucket_size", z.reduce_bucket_size, at_least(1));
  v.field("allgather_bucket_size", z.allgather_bucket_size, at_least(1));
  v.field("overlap_comm", z.overlap_comm);
  // Other communication knobs: no counterpart here, accepted so ds_configs load.
  for (const char* k :
       {"allgather_partitions", "reduce_scatter", "contiguous_gradients", "round_robin_gradients",
        "grad_hooks", "ignore_unused_parameters", "elastic_checkpoint", "zero_hpz_partition_size",
        "zero_quantized_weights", "zero_quantized_gradients"}) {
    v.multi_gpu(k);
  }
  // Stage 3 partitions parameters across GPUs; one GPU holds them all.
  for (const char* k :
       {"stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "sub_group_size"}) {
    v.no_effect(k, "a ZeRO stage 3 setting; one GPU holds every parameter");
  }
  v.no_effect("offload_param",
              "parameter offload is not implemented; parameters stay on the device");
  v.refused("cpu_offload",
            "it is DeepSpeed's deprecated switch; use zero_optimization.offload_optimizer.device = "
            "\"cpu\"");
}

void visit_fields(auto& v, Section<ActivationCheckpointingConfig> auto& a) {
  v.field("partition_activations", a.partition_activations);
  v.field("cpu_checkpointing", a.cpu_checkpointing);
  v.field("contiguous_memory_optimization", a.contiguous_memory_optimization);
  v.field("number_checkpoints", a.number_checkpoints, at_least(0));
  v.field("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  v.field("profile", a.profile);
}

void visit_fields(auto& v, Section<FlopsProfilerConfig> auto& p) {
  v.field("enabled", p.enabled);
  v.field("profile_step", p.profile_step, at_least(1));
  v.field("module_depth", p.module_depth, at_least(-1, "-1 = every depth"));
  v.field("top_modules", p.top_modules, at_least(1));
  v.field("detailed", p.detailed);
  v.field("output_file", p.output_file);
}

void visit_fields(auto& v, Section<MonitorSinkConfig> auto& s) {
  v.field("enabled", s.enabled);
  v.field("output_path", s.output_path);
  v.field("job_name", s.job_name);
}

void visit_fields(auto& v, Section<RopeScalingConfig> auto& r) {
  v.field("type", r.type);
  v.field("factor", r.factor, at_least(1));
  v.field("original_max_position_embeddings", r.original_max_position_embeddings,
          at_least(0, "0 = unset"));
  v.field("beta_fast", r.beta_fast, above(0));
  v.field("beta_slow", r.beta_slow, above(0));
  v.field("attention_factor", r.attention_factor, at_least(0, "0 = 0.1 ln(factor) + 1"));
  v.field("truncate", r.truncate);
  v.field("mscale_all_dim", r.mscale_all_dim, at_least(0, "0 = the softmax scale unchanged"));
  v.field("llama_4_scaling_beta", r.llama_4_scaling_beta, at_least(0, "0 = off"));
}

void visit_fields(auto& v, Section<ModelConfig> auto& m) {
  v.field("vocab_size", m.vocab_size, in(2, double(int64_t(1) << 31)).says("must be in [2, 2^31]"));
  v.field("seq_len", m.seq_len, in(1, 1 << 20));
  v.field("hidden_size", m.hidden_size, in(1, 65536));
  v.field("num_layers", m.num_layers, in(1, 1024));
  v.field("num_heads", m.num_heads, at_least(1));
  v.field("dropout", m.dropout, in_open(0, 1));
  v.field("init_std", m.init_std, above(0));
  v.field("norm_eps", m.norm_eps, above(0));
  v.field("tie_embeddings", m.tie_embeddings);
  v.field("padding_idx", m.padding_idx,
          in(-1, double(int64_t(1) << 31)).says("must be -1 (none) or a token id"));
  v.field("rope_theta", m.rope_theta, at_least(0, "0 = learned positions"));
  section(v, "rope_scaling", m.rope_scaling);
  v.field("num_key_value_heads", m.num_key_value_heads, at_least(0, "0 = num_heads"));
  v.field("head_dim", m.head_dim, at_least(0, "0 = hidden_size / num_heads"));
  v.field("qk_norm", m.qk_norm);
  v.field("qk_norm_scope", m.qk_norm_scope);
  v.field("clip_qkv", m.clip_qkv, at_least(0, "0 = off"));
  v.field("attention_bias", m.attention_bias);
  v.field("qkv_bias", m.qkv_bias);
  v.field("partial_rotary_factor", m.partial_rotary_factor,
          Rule{.kind = Rule::Kind::kRange, .lo = 0.0, .hi = 1.0, .lo_open = true});
  v.field("attention_sinks", m.attention_sinks);
  v.field("sliding_window", m.sliding_window, at_least(0, "0 = none"));
  v.field("layer_types", m.layer_types);
  v.field("dense_hidden_size", m.dense_hidden_size, at_least(0, "0 = derived from hidden_size"));
  v.field("init_from", m.init_from);
  v.field("attention_backend", m.attention_backend);
  v.field("kv_lora_rank", m.kv_lora_rank, at_least(0, "0 = no latent attention"));
  v.field("q_lora_rank", m.q_lora_rank, at_least(0, "0 = one q_proj"));
  v.field("qk_nope_head_dim", m.qk_nope_head_dim, at_least(0));
  v.field("qk_rope_head_dim", m.qk_rope_head_dim, at_least(0));
  v.field("v_head_dim", m.v_head_dim, at_least(0));
  v.field("rope_interleave", m.rope_interleave);
  v.field("zero_centered_norm", m.zero_centered_norm);
  v.field("attention_output_gate", m.attention_output_gate);
  v.field("linear_num_key_heads", m.linear_num_key_heads, at_least(0, "0 = no linear attention"));
  v.field("linear_num_value_heads", m.linear_num_value_heads, at_least(0));
  v.field("linear_key_head_dim", m.linear_key_head_dim, at_least(0));
  v.field("linear_value_head_dim", m.linear_value_head_dim, at_least(0));
  v.field("linear_conv_kernel_dim", m.linear_conv_kernel_dim, in(1, 64));
  v.field("linear_fused_projections", m.linear_fused_projections);
  v.field("global_head_dim", m.global_head_dim, at_least(0, "0 = head_dim"));
  v.field("global_num_key_value_heads", m.global_num_key_value_heads,
          at_least(0, "0 = num_key_value_heads"));
  v.field("global_rope_theta", m.global_rope_theta, at_least(0, "0 = rope_theta"));
  v.field("global_partial_rotary_factor", m.global_partial_rotary_factor,
          Rule{.kind = Rule::Kind::kRange, .lo = 0.0, .hi = 1.0, .lo_open = true});
  v.field("attention_k_eq_v", m.attention_k_eq_v);
  v.field("value_norm", m.value_norm);
  v.field("attention_scale", m.attention_scale, at_least(0, "0 = 1 / sqrt(head_dim)"));
  v.field("scale_embeddings", m.scale_embeddings);
  v.field("final_logit_softcapping", m.final_logit_softcapping, at_least(0, "0 = off"));
  v.field("sandwich_norms", m.sandwich_norms);
  v.field("layer_scalar", m.layer_scalar);
  v.field("mamba_num_heads", m.mamba_num_heads, at_least(0, "0 = no Mamba-2 layers"));
  v.field("mamba_head_dim", m.mamba_head_dim, at_least(0));
  v.field("ssm_state_size", m.ssm_state_size, at_least(0));
  v.field("mamba_n_groups", m.mamba_n_groups, at_least(1));
  v.field("mamba_conv_kernel", m.mamba_conv_kernel, in(1, 64));
  v.field("mamba_chunk_size", m.mamba_chunk_size, in(1, 4096));
  v.field("mamba_conv_bias", m.mamba_conv_bias);
  v.field("mamba_proj_bias", m.mamba_proj_bias);
  v.field("mamba_dt_min", m.mamba_dt_min, at_least(0));
  v.field("mamba_dt_max", m.mamba_dt_max, at_least(0, "0 = unbounded"));
  v.field("sublayer_blocks", m.sublayer_blocks);
  v.field("no_position_encoding", m.no_position_encoding);
  v.field("embedding_multiplier", m.embedding_multiplier, above(0));
  v.field("residual_multiplier", m.residual_multiplier, above(0));
  v.field("logits_scaling", m.logits_scaling, above(0));
}

void visit_fields(auto& v, Section<MoeConfig> auto& m) {
  v.field("num_experts", m.num_experts, in(1, 1024));
  v.field("top_k", m.top_k, in(1, 64));
  v.field("expert_hidden_size", m.expert_hidden_size, at_least(0, "0 = derived from hidden_size"));
  v.field("score_function", m.score_function);
  v.field("normalize_topk", m.normalize_topk);
  v.field("aux_loss_coeff", m.aux_loss_coeff, at_least(0));
  v.field("z_loss_coeff", m.z_loss_coeff, at_least(0));
  v.field("capacity_factor", m.capacity_factor, at_least(0, "0 = dropless"));
  v.field("expert_dropout", m.expert_dropout, in_open(0, 1));
  v.field("shared_expert_hidden_size", m.shared_expert_hidden_size,
          at_least(0, "0 = no shared expert"));
  v.field("shared_expert_gate", m.shared_expert_gate);
  v.field("latent_size", m.latent_size, at_least(0, "0 = the experts read the hidden size"));
  v.field("expert_parallel_size", m.expert_parallel_size, at_least(1, "1 = no expert parallelism"));
  v.field("offload_experts", m.offload_experts);
  v.field("offload_ring_layers", m.offload_ring_layers,
          at_least(2, "2 = the layer computed and the one fetched ahead"));
  v.field("router_bias_update_rate", m.router_bias_update_rate,
          in_open(0, 1, "0 = no expert bias"));
  v.field("n_group", m.n_group, at_least(1, "1 = no expert groups"));
  v.field("group_score_experts", m.group_score_experts, at_least(1));
  v.field("topk_group", m.topk_group, at_least(1));
  v.field("routed_scaling_factor", m.routed_scaling_factor, above(0));
  v.field("kernels", m.kernels);
  v.field("dispatch_dtype", m.dispatch_dtype);
  v.field("fused_gate_up", m.fused_gate_up);
  v.field("decoder_sparse_step", m.decoder_sparse_step, at_least(1));
  v.field("mlp_only_layers", m.mlp_only_layers, at_least(0));
  v.field("router_bias", m.router_bias);
  v.field("softmax_after_topk", m.softmax_after_topk);
  v.field("expert_bias", m.expert_bias);
  v.field("activation", m.activation);
  v.field("swiglu_limit", m.swiglu_limit, above(0));
  v.field("swiglu_alpha", m.swiglu_alpha, above(0));
  v.field("parallel_dense", m.parallel_dense);
  v.field("router_input_norm", m.router_input_norm);
  v.field("per_expert_scale", m.per_expert_scale);
}

void visit_fields(auto& v, Section<DistributedConfig> auto& d) {
  v.field("backend", d.backend);
  v.field("timeout_s", d.timeout_s, above(0));
}

void visit_fields(auto& v, Section<DataConfig> auto& d) {
  v.field("path", d.path);
  v.field("train_path", d.train_path);
  v.field("valid_path", d.valid_path);
  v.field("verify_checksums", d.verify_checksums);
  v.field("shuffle", d.shuffle);
  v.field("prefetch", d.prefetch, in(1, 1024));
  v.field("reader_threads", d.reader_threads, in(1, 64));
  v.field("block_windows", d.block_windows, at_least(1));
  v.field("reset_attention_at_eod", d.reset_attention_at_eod);
  v.field("eod_id", d.eod_id, at_least(-1, "-1 = none"));
  v.field("blend", d.blend);  // each entry is checked by validate()
  v.field("cache_dir", d.cache_dir);
  v.field("cache_max_bytes", d.cache_max_bytes, at_least(0, "0 = unbounded"));
}

void visit_fields(auto& v, Section<TrainingConfig> auto& t) {
  v.field("output_dir", t.output_dir, not_empty("must not be empty"));
  v.field("train_iters", t.train_iters, at_least(0, "0 = derive from epochs"));
  v.field("epochs", t.epochs, at_least(1));
  v.field("eval_interval", t.eval_interval, at_least(0, "0 = only at the end"));
  v.field("eval_iters", t.eval_iters, at_least(1));
  v.field("seed", t.seed);
  v.field("device", t.device);
  v.field("exit_interval", t.exit_interval, at_least(0, "0 = off"));
  v.field("max_bad_steps", t.max_bad_steps, at_least(1));
  v.field("exit_duration_minutes", t.exit_duration_minutes, at_least(0, "0 = off"));
  v.field("cuda_graph", t.cuda_graph);
  v.field("head_chunk_tokens", t.head_chunk_tokens, at_least(0, "0 = the whole micro-batch"));
  v.field("cpu_affinity", t.cpu_affinity);
  v.field("param_dtype", t.param_dtype);
  v.field("profile_step_start", t.profile_step_start, at_least(0, "0 = off"));
  v.field("profile_step_end", t.profile_step_end, at_least(0, "0 = profile_step_start + 1"));
}

void visit_fields(auto& v, Section<CheckpointConfig> auto& k) {
  v.field("save_interval", k.save_interval, at_least(0, "0 = off"));
  v.field("save_interval_minutes", k.save_interval_minutes, at_least(0, "0 = off"));
  v.field("keep_last", k.keep_last, at_least(1));
  v.field("keep_every", k.keep_every, at_least(0, "0 = none"));
  v.field("save_initial", k.save_initial);
  v.field("save_final", k.save_final);
  v.field("on_failure", k.on_failure);
  v.field("remote", k.remote);
  v.field("remote_grace_s", k.remote_grace_s, at_least(0));
  // DeepSpeed's own checkpoint keys: consistency and layout across ranks.
  for (const char* key :
       {"tag_validation", "load_universal", "use_node_local_storage", "parallel_write"}) {
    v.multi_gpu(key);
  }
}

void visit_fields(auto& v, Section<MonitorConfig> auto& m) {
  v.object("prometheus", [&] {
    v.field("port", m.prometheus_port, in(0, 65535, "0 = off"));
    v.field("host", m.prometheus_host, not_empty("must name an address to bind, e.g. 127.0.0.1"));
  });
  v.field("peak_tflops", m.peak_tflops, at_least(0, "0 = known GPUs only"));
}

void visit_fields(auto& v, Section<LoraConfig> auto& l) {
  v.field("r", l.r, in(0, 4096, "0 = no LoRA"));
  v.field("lora_alpha", l.lora_alpha, above(0));
  v.field("lora_dropout", l.lora_dropout, in_open(0, 1));
  v.field("target_modules", l.target_modules, one_of(kLoraTargetNames));
  v.field("use_rslora", l.use_rslora);
  v.field("modules_to_save", l.modules_to_save, one_of(kLoraSaveableNames));
  // PEFT's other keys that describe what we always do, or cannot do.
  v.ignored("task_type");       // CAUSAL_LM is the only task here
  v.ignored("bias");            // "none": our projections have no biases
  v.ignored("inference_mode");  // export-hf --adapter writes it
}

void visit_fields(auto& v, Section<QuantizationConfig> auto& q) {
  v.field("load_in_4bit", q.load_in_4bit);
  v.field("bnb_4bit_quant_type", q.bnb_4bit_quant_type);
  v.field("bnb_4bit_use_double_quant", q.bnb_4bit_use_double_quant);
  v.field("bnb_4bit_compute_dtype", q.bnb_4bit_compute_dtype);
  v.field("dequant_scratch_mib", q.dequant_scratch_mib, at_least(0, "0 = a whole stack"));
  // BitsAndBytesConfig's other keys, as transformers writes them into config.json.
  v.field("quant_method", q.quant_method);
  v.ignored("dequantize");              // Mxfp4Config's: moe-train dequantizes for the GEMMs anyway
  v.ignored("modules_to_not_convert");  // Mxfp4Config's: attention, routers, embeddings, head
  v.ignored("bnb_4bit_quant_storage");  // uint8: how the codes are stored
  v.field("load_in_8bit", q.load_in_8bit);  // refused in validate() when true
  v.ignored("llm_int8_threshold");
  v.ignored("llm_int8_skip_modules");
  v.ignored("llm_int8_enable_fp32_cpu_offload");
  v.ignored("llm_int8_has_fp16_weight");
  v.ignored("_load_in_4bit");
  v.ignored("_load_in_8bit");
}

void visit_fields(auto& v, Section<Config> auto& c) {
  // The batch triple's rules are cross-field: validate() resolves it.
  v.field("train_batch_size", c.train_batch_size);
  v.field("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  v.field("gradient_accumulation_steps", c.gradient_accumulation_steps);
  section(v, "optimizer", c.optimizer);
  section(v, "scheduler", c.scheduler);
  section(v, "fp16", c.fp16);
  section(v, "bf16", c.bf16);
  v.field("gradient_clipping", c.gradient_clipping, at_least(0, "0 = off"));
  v.field("steps_per_print", c.steps_per_print, at_least(1));
  v.field("wall_clock_breakdown", c.wall_clock_breakdown);
  section(v, "zero_optimization", c.zero_optimization);
  section(v, "activation_checkpointing", c.activation_checkpointing);
  section(v, "tensorboard", c.tensorboard);
  section(v, "csv_monitor", c.csv_monitor);
  section(v, "flops_profiler", c.flops_profiler);
  // DeepSpeed's other top-level keys: accepted with a warning, or refused (deepspeed_keys.h).
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    switch (k.status) {
      case DeepSpeedKeyStatus::kImplemented:
        break;  // read above
      case DeepSpeedKeyStatus::kMultiGpu:
        v.multi_gpu(k.key);
        break;
      case DeepSpeedKeyStatus::kNoEffect:
        v.no_effect(k.key, k.note);
        break;
      case DeepSpeedKeyStatus::kRefused:
        v.refused(k.key, k.note);
        break;
    }
  }
  section(v, "model", c.model);
  section(v, "moe", c.moe);
  section(v, "data", c.data);
  section(v, "training", c.training);
  section(v, "checkpoint", c.checkpoint);
  section(v, "monitor", c.monitor);
  section(v, "distributed", c.distributed);
  section(v, "lora", c.lora);
  section(v, "quantization", c.quantization);
  v.ignored("$schema");  // lets editors find configs/schema.json
}

}  // namespace moe::config
