// Every top-level key DeepSpeed documents is read, accepted with one warning naming it, or refused
// naming it and the reason; docs/config.md's table says the same as the code's table
// (include/moe/config/deepspeed_keys.h).
#include "moe/config/deepspeed_keys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config_test_util.h"
#include "moe/config/config.h"
#include "moe/config/key_specs.h"
#include "moe/util/errors.h"

namespace moe::config {
namespace {

using nlohmann::json;

// The top-level keys of DeepSpeed's configuration page, "DeepSpeed Configuration JSON"
// (docs/_pages/config-json.md in microsoft/DeepSpeed, https://www.deepspeed.ai/docs/config-json/),
// in its order, each with a value as a ds_config.json would give it (the page's examples where
// it has them). fp32_allreduce and bfloat16 are from older versions of the page (now
// communication_data_type and bf16); comet is on the current page's monitoring section.
const std::vector<std::pair<std::string, json>>& documented_keys() {
  static const std::vector<std::pair<std::string, json>> keys = {
      // Batch Size Related Parameters
      {"train_batch_size", 8},
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", 2},
      // Optimizer Parameters
      {"optimizer", json::parse(R"({"type": "AdamW", "params": {"lr": 0.001,
        "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}})")},
      // Scheduler Parameters
      {"scheduler", json::parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0,
        "warmup_max_lr": 0.001, "warmup_num_steps": 1000}})")},
      // Communication options
      {"communication_data_type", "fp32"},
      {"fp32_allreduce", true},
      {"prescale_gradients", true},
      {"gradient_predivide_factor", 1.0},
      {"sparse_gradients", false},
      // FP16, BFLOAT16 and AMP training options
      {"fp16", json::parse(R"({"enabled": true, "auto_cast": false, "loss_scale": 0,
        "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
        "consecutive_hysteresis": false, "min_loss_scale": 1})")},
      {"bf16", json::parse(R"({"enabled": true})")},
      {"bfloat16", json::parse(R"({"enabled": true})")},
      {"amp", json::parse(R"({"enabled": true, "opt_level": "O1"})")},
      // Gradient Clipping
      {"gradient_clipping", 1.0},
      // ZeRO Optimizations (parameter and optimizer offloading are its sub-keys)
      {"zero_optimization", json::parse(R"({"stage": 3, "allgather_partitions": true,
        "allgather_bucket_size": 5e8, "overlap_comm": false, "reduce_scatter": true,
        "reduce_bucket_size": 5e8, "contiguous_gradients": true,
        "offload_param": {"device": "cpu", "pin_memory": true},
        "offload_optimizer": {"device": "cpu", "pin_memory": true},
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e6,
        "sub_group_size": 1e12, "elastic_checkpoint": false,
        "stage3_gather_16bit_weights_on_model_save": true, "ignore_unused_parameters": true,
        "round_robin_gradients": false, "zero_hpz_partition_size": 1,
        "zero_quantized_weights": false, "zero_quantized_gradients": false})")},
      // Asynchronous I/O
      {"aio", json::parse(R"({"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
        "single_submit": false, "overlap_events": true})")},
      // Logging
      {"steps_per_print", 10},
      {"wall_clock_breakdown", false},
      {"dump_state", false},
      // Autotuning
      {"autotuning", json::parse(R"({"enabled": true, "results_dir": "autotuning_results",
        "metric": "throughput", "start_profile_step": 3, "end_profile_step": 5})")},
      // Flops Profiler
      {"flops_profiler", json::parse(R"({"enabled": true, "profile_step": 1, "module_depth": -1,
        "top_modules": 1, "detailed": true, "output_file": null})")},
      // Activation Checkpointing
      {"activation_checkpointing", json::parse(R"({"partition_activations": false,
        "cpu_checkpointing": false, "contiguous_memory_optimization": false,
        "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
        "profile": false})")},
      // Sparse Attention
      {"sparse_attention", json::parse(R"({"mode": "fixed", "block": 16,
        "different_layout_per_head": true, "num_local_blocks": 4, "num_global_blocks": 1,
        "attention": "bidirectional"})")},
      // Data Efficiency and (legacy) Curriculum Learning
      {"data_efficiency", json::parse(R"({"enabled": true, "seed": 1234,
        "data_sampling": {"enabled": true, "num_epochs": 1}})")},
      {"curriculum_learning", json::parse(R"({"enabled": true, "curriculum_type": "seqlen",
        "min_difficulty": 8, "max_difficulty": 1024, "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 40000, "difficulty_step": 8}})")},
      // Monitoring Module
      {"tensorboard", json::parse(R"({"enabled": true, "output_path": "output/ds_logs/",
        "job_name": "train_bert"})")},
      {"wandb", json::parse(R"({"enabled": true, "group": "my_group", "team": "my_team",
        "project": "my_project"})")},
      {"csv_monitor", json::parse(R"({"enabled": true, "output_path": "output/ds_logs/",
        "job_name": "train_bert"})")},
      {"comet", json::parse(R"({"enabled": true, "project": "my_project",
        "samples_log_interval": 100})")},
      // Elastic Training Config
      {"elasticity", json::parse(R"({"enabled": true, "max_train_batch_size": 2000,
        "micro_batch_sizes": [2, 4, 6], "min_gpus": 1, "max_gpus": 10000, "version": 0.2})")},
      // Communication Logging
      {"comms_logger", json::parse(R"({"enabled": true, "verbose": false, "prof_all": true,
        "debug": false})")},
      // Compression
      {"compression_training", json::parse(R"({"layer_reduction": {"enabled": true,
        "keep_number_layer": 5, "module_name_prefix": "bert.encoder.layer"}})")},
      // Checkpoint options
      {"checkpoint", json::parse(R"({"tag_validation": "Warn", "load_universal": false,
        "use_node_local_storage": false, "parallel_write": {"pipeline_stage": false}})")},
      // Data Type options
      {"data_types", json::parse(R"({"grad_accum_dtype": "fp32"})")},
  };
  return keys;
}

using test_util::build;
using test_util::minimal;
// The UserError message; "" when the config loads.
template <class F>
std::string error_of(F fn) {
  return test_util::user_error(fn);
}

const DeepSpeedKey* entry(const std::string& key) {
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

TEST(DeepSpeedKeys, EveryDocumentedKeyIsReadWarnedOrRefused) {
  for (const auto& [key, value] : documented_keys()) {
    SCOPED_TRACE(key);
    const DeepSpeedKey* k = entry(key);
    ASSERT_NE(k, nullptr) << key << ": not in kDeepSpeedKeys (include/moe/config/deepspeed_keys.h)";
    json j = minimal();
    j[key] = value;
    const std::string note(k->note);
    switch (k->status) {
      case DeepSpeedKeyStatus::kImplemented: {
        const std::string error = error_of([&] { build(j); });
        EXPECT_EQ(error, "") << "an implemented key fails to load";
        break;
      }
      case DeepSpeedKeyStatus::kMultiGpu:
        EXPECT_EQ(build(j).warnings,
                  std::vector<std::string>{key + " is a multi-GPU setting; ignored"});
        break;
      case DeepSpeedKeyStatus::kNoEffect:
        EXPECT_EQ(build(j).warnings,
                  std::vector<std::string>{key + " has no effect here: " + note});
        break;
      case DeepSpeedKeyStatus::kRefused: {
        const std::string error = error_of([&] { build(j); });
        EXPECT_EQ(error, "config: test.json: " + key + " is not supported: " + note);
        EXPECT_EQ(error.find('\n'), std::string::npos);
        break;
      }
    }
  }
}

// A refused block that asks for nothing loads, with one warning; any content is accepted.
TEST(DeepSpeedKeys, DisabledRefusedBlocksWarn) {
  json j = minimal();
  j["amp"] = json::parse(R"({"enabled": false, "opt_level": "O2", "anything": [1, {"x": 2}]})");
  j["zero_optimization"] = {{"cpu_offload", false}};
  EXPECT_EQ(build(j).warnings,
            (std::vector<std::string>{
                "zero_optimization.cpu_offload is disabled; ignored (not supported: it is "
                "DeepSpeed's deprecated switch; use zero_optimization.offload_optimizer.device "
                "= \"cpu\")",
                "amp is disabled; ignored (not supported: Apex AMP is not built in; use bf16 or "
                "fp16)"}));
  j["zero_optimization"] = {{"cpu_offload", true}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: zero_optimization.cpu_offload is not supported: it is "
            "DeepSpeed's deprecated switch; use zero_optimization.offload_optimizer.device = "
            "\"cpu\"");
  // Only a literal false disables: Hugging Face's "auto" does not.
  j = minimal();
  j["amp"] = {{"enabled", "auto"}, {"opt_level", "auto"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: amp is not supported: Apex AMP is not built in; use bf16 or fp16");
}

// The Hugging Face Trainer's "auto" stays an error: the value must be written out.
TEST(DeepSpeedKeys, HuggingFaceAutoValuesAreRefused) {
  json j = minimal();
  j["train_micro_batch_size_per_gpu"] = "auto";
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: train_micro_batch_size_per_gpu = \"auto\": expected an integer");
  j = minimal();
  j["gradient_clipping"] = "auto";
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: gradient_clipping = \"auto\": expected a number");
}

// The table's implemented keys are top-level keys of the field lists, and each key once.
TEST(DeepSpeedKeys, TableAgreesWithTheFieldLists) {
  std::set<std::string> top_level;
  for (const KeySpec& s : key_specs()) {
    if (s.path.find('.') == std::string::npos) top_level.insert(s.path);
  }
  std::set<std::string_view> seen;
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    EXPECT_TRUE(seen.insert(k.key).second) << k.key << ": twice in kDeepSpeedKeys";
    EXPECT_TRUE(top_level.count(std::string(k.key))) << k.key << ": not in the field lists";
    EXPECT_FALSE(k.note.empty()) << k.key;
  }
}

// docs/config.md's "Every DeepSpeed top-level key" table: key -> status.
std::map<std::string, std::string> documented_statuses() {
  std::ifstream in(MOE_SOURCE_DIR "/docs/config.md");
  EXPECT_TRUE(in) << "cannot read docs/config.md";
  std::map<std::string, std::string> rows;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) in_section = line == "### Every DeepSpeed top-level key";
    if (!in_section || line.rfind("| `", 0) != 0) continue;
    // | `key` | status | note |
    const size_t key_end = line.find('`', 3);
    const size_t status_begin = line.find("| ", key_end) + 2;
    const size_t status_end = line.find(" |", status_begin);
    rows[line.substr(3, key_end - 3)] = line.substr(status_begin, status_end - status_begin);
  }
  return rows;
}

TEST(DeepSpeedKeys, DocsTableListsEveryKeyWithItsStatus) {
  const auto docs = documented_statuses();
  ASSERT_FALSE(docs.empty()) << "no table under '### Every DeepSpeed top-level key'";
  for (const auto& [key, value] : documented_keys()) {
    EXPECT_TRUE(docs.count(key)) << key << ": documented by DeepSpeed, missing from the table";
  }
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    const auto it = docs.find(std::string(k.key));
    if (it == docs.end()) {
      ADD_FAILURE() << k.key << ": in kDeepSpeedKeys, missing from docs/config.md";
      continue;
    }
    EXPECT_EQ(it->second, status_label(k.status)) << k.key;
  }
  for (const auto& [key, status] : docs) {
    EXPECT_NE(entry(key), nullptr) << key << ": in docs/config.md, not in kDeepSpeedKeys";
  }
}

}  // namespace
}  // namespace moe::config
