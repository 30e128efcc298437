// DeepSpeed's top-level config keys and what moe-train does with each, in one table: read
// (implemented), accepted with a one-line warning because it has no effect on one process, or
// refused naming the key and the reason. The top-level field list (src/config/fields.h) walks the
// accepted and refused rows, docs/config.md shows the table, and tests/config/deepspeed_keys_test
// checks both against the keys DeepSpeed's configuration page documents. A warned or refused key
// is read as an opaque value: whatever a pasted ds_config.json holds inside it is accepted.
#pragma once

#include <string_view>

namespace moe::config {

enum class DeepSpeedKeyStatus {
  kImplemented,  // read by the field lists (a section or a field of its own)
  kMultiGpu,     // warns "KEY is a multi-GPU setting; ignored"
  kNoEffect,     // warns "KEY has no effect here: NOTE"
  kRefused,      // "config: FILE: KEY is not supported: NOTE"; warns instead when disabled
};

struct DeepSpeedKey {
  std::string_view key;
  DeepSpeedKeyStatus status;
  // Implemented: what is read. Multi-GPU: why one process has no use for it. No effect and
  // refused: the reason, as the warning or the error says it.
  std::string_view note;
};

// In the order of DeepSpeed's configuration page (docs/_pages/config-json.md), then the keys it
// does not document that DeepSpeed reads.
inline constexpr DeepSpeedKey kDeepSpeedKeys[] = {
    // Batch size
    {"train_batch_size", DeepSpeedKeyStatus::kImplemented,
     "sequences per optimizer step; any two of the batch triple give the third (world size 1)"},
    {"train_micro_batch_size_per_gpu", DeepSpeedKeyStatus::kImplemented,
     "sequences per forward/backward"},
    {"gradient_accumulation_steps", DeepSpeedKeyStatus::kImplemented,
     "micro-batches per optimizer step"},
    // Optimizer and scheduler
    {"optimizer", DeepSpeedKeyStatus::kImplemented,
     "type AdamW or Adam; params lr, betas, eps, weight_decay (torch_adam and adam_w_mode are "
     "accepted); other types are refused with the list"},
    {"scheduler", DeepSpeedKeyStatus::kImplemented,
     "WarmupLR, WarmupDecayLR, WarmupCosineLR with DeepSpeed's params, plus "
     "LinearWarmupCosineDecay and Constant"},
    // Communication options
    {"communication_data_type", DeepSpeedKeyStatus::kMultiGpu,
     "the gradient all-reduce's data type; one process has no all-reduce"},
    {"fp32_allreduce", DeepSpeedKeyStatus::kMultiGpu,
     "the gradient all-reduce's data type; one process has no all-reduce"},
    {"prescale_gradients", DeepSpeedKeyStatus::kMultiGpu,
     "scaling before the gradient all-reduce; one process has no all-reduce"},
    {"gradient_predivide_factor", DeepSpeedKeyStatus::kMultiGpu,
     "scaling before the gradient all-reduce; one process has no all-reduce"},
    {"sparse_gradients", DeepSpeedKeyStatus::kMultiGpu,
     "sparse all-reduce of embedding gradients; one process has no all-reduce"},
    // Precision
    {"fp16", DeepSpeedKeyStatus::kImplemented,
     "fp16 autocast with DeepSpeed's dynamic loss scaler, key for key (auto_cast is accepted: "
     "the inputs are token ids)"},
    {"bf16", DeepSpeedKeyStatus::kImplemented, "enabled: bf16 autocast on CUDA"},
    {"bfloat16", DeepSpeedKeyStatus::kRefused,
     "it is DeepSpeed's old name for bf16; rename it to bf16"},
    {"amp", DeepSpeedKeyStatus::kRefused, "Apex AMP is not built in; use bf16 or fp16"},
    {"gradient_clipping", DeepSpeedKeyStatus::kImplemented, "global grad-norm clip; 0 = off"},
    // ZeRO and offloading
    {"zero_optimization", DeepSpeedKeyStatus::kImplemented,
     "stage 0-3 (above 0 warns: one GPU has nothing to partition); offload_optimizer with "
     "device none or cpu; the communication, ZeRO++ and stage 3 keys and offload_param are "
     "accepted with a warning; cpu_offload is refused (use offload_optimizer)"},
    {"aio", DeepSpeedKeyStatus::kNoEffect,
     "it tunes NVMe offload, which is not supported (offload_optimizer.device is none or cpu)"},
    // Logging
    {"steps_per_print", DeepSpeedKeyStatus::kImplemented, "console line every N steps"},
    {"wall_clock_breakdown", DeepSpeedKeyStatus::kImplemented,
     "forward, backward and optimizer times in the metrics (CUDA syncs between the phases)"},
    {"dump_state", DeepSpeedKeyStatus::kNoEffect,
     "the resolved config is written to <output_dir>/config.json, and `moe-train config show` "
     "prints it"},
    // Autotuning, profiling, activation checkpointing
    {"autotuning", DeepSpeedKeyStatus::kRefused,
     "there is no autotuner; set train_micro_batch_size_per_gpu yourself"},
    {"flops_profiler", DeepSpeedKeyStatus::kImplemented,
     "a per-module table (parameters, FLOPs, forward latency, share of the step) at profile_step; "
     "module_depth 1 or detailed false: one row per module kind; output_file"},
    {"activation_checkpointing", DeepSpeedKeyStatus::kImplemented,
     "number_checkpoints: recompute the first N blocks in the backward; the block's other keys "
     "are accepted"},
    // Sparse attention, data efficiency
    {"sparse_attention", DeepSpeedKeyStatus::kRefused,
     "block-sparse attention is not implemented; attention is dense and causal"},
    {"data_efficiency", DeepSpeedKeyStatus::kRefused,
     "curriculum learning and random-LTD are not implemented"},
    {"curriculum_learning", DeepSpeedKeyStatus::kRefused,
     "curriculum learning is not implemented; every sequence has model.seq_len tokens"},
    // Monitoring
    {"tensorboard", DeepSpeedKeyStatus::kImplemented, "enabled, output_path, job_name"},
    {"wandb", DeepSpeedKeyStatus::kNoEffect,
     "Weights & Biases logging is not built in; use tensorboard, csv_monitor or "
     "monitor.prometheus"},
    {"csv_monitor", DeepSpeedKeyStatus::kImplemented, "enabled, output_path, job_name"},
    {"comet", DeepSpeedKeyStatus::kNoEffect,
     "Comet logging is not built in; use tensorboard, csv_monitor or monitor.prometheus"},
    // Elasticity, communication logging, compression
    {"elasticity", DeepSpeedKeyStatus::kRefused,
     "elastic training resizes multi-GPU jobs; set the batch with train_batch_size"},
    {"comms_logger", DeepSpeedKeyStatus::kMultiGpu,
     "it logs collective calls; one process makes none"},
    {"compression_training", DeepSpeedKeyStatus::kRefused,
     "quantization and pruning during training are not implemented"},
    // Checkpoint and data types
    {"checkpoint", DeepSpeedKeyStatus::kImplemented,
     "moe-train's checkpoint section (save_interval, keep_last, ...); DeepSpeed's "
     "tag_validation, load_universal, use_node_local_storage and parallel_write are accepted "
     "with the multi-GPU warning"},
    {"data_types", DeepSpeedKeyStatus::kNoEffect,
     "gradients accumulate in fp32 (parameters stay fp32 under autocast)"},
    // Not on the configuration page
    {"zero_allow_untested_optimizer", DeepSpeedKeyStatus::kMultiGpu,
     "ZeRO's check of the optimizer; one process partitions nothing"},
};

// The status as docs/config.md's table says it.
constexpr std::string_view status_label(DeepSpeedKeyStatus s) {
  switch (s) {
    case DeepSpeedKeyStatus::kImplemented:
      return "implemented";
    case DeepSpeedKeyStatus::kMultiGpu:
    case DeepSpeedKeyStatus::kNoEffect:
      return "accepted, no effect";
    case DeepSpeedKeyStatus::kRefused:
      return "refused";
  }
  return "";
}

}  // namespace moe::config
