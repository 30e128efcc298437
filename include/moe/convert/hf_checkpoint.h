// moe-train checkpoints <-> Hugging Face model directories (import-hf, export-hf), with LibTorch
// kept behind this header so the CLI stays a light translation unit. Every tensor is mapped both
// ways by one table (hf_tensor_map.h); load_hf_weights.h loads HF weights into a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/config/config.h"
#include "moe/hf/hf_config.h"

namespace moe::convert {

struct ImportReport {
  const families::ModelFamily* family = nullptr;
  int64_t tensors = 0;
  std::vector<std::string> warnings;         // HF settings that are not imported
  std::vector<std::string> tokenizer_files;  // copied alongside
};

// HF_DIR -> a weights-only moe-train checkpoint in `out_dir` (model.safetensors, state.json,
// moe-train.json with the model/moe sections, hf_config.json, tokenizer and generation files).
// Everything is checked before anything is written; `out_dir` must not exist or be empty, and
// appears complete or not at all.
// `adapter_dir` (optional): a PEFT LoRA adapter of that model, merged into the imported weights.
ImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                       const std::string& adapter_dir = "");

struct ExportOptions {
  std::string architecture;                            // "" = from the checkpoint's architecture
  int64_t max_shard_bytes = 5LL * 1000 * 1000 * 1000;  // transformers' default "5GB"
  std::string dtype = "float32";                       // float32 | bfloat16 | float16
  // A LoRA checkpoint (lora.r > 0) needs one of: `merge` folds the adapters into the base
  // (full weights, base + s B A); `adapter` writes PEFT's adapter_config.json +
  // adapter_model.safetensors instead of a model (peft_adapter.h).
  bool merge = false, adapter = false;
};

struct ExportReport {
  const families::ModelFamily* family = nullptr;
  int64_t tensors = 0, shards = 0;
  std::vector<std::string> tokenizer_files;
  std::vector<std::string> warnings;  // what the user must know to load the result as trained
};

// A moe-train checkpoint -> an HF directory of `family`'s layout that transformers'
// AutoModelForCausalLM loads with no missing or unexpected keys. Same write rules as import_hf.
ExportReport export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                       const ExportOptions& opt);

}  // namespace moe::convert
