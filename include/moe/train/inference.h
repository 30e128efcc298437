// `moe-train eval`, `moe-train generate` and `moe-train checkpoint info`, with LibTorch kept
// behind this header so the CLI stays a light translation unit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "moe/config/config.h"

namespace moe::train {

struct EvalRequest {
  std::string config_path;             // data and evaluation settings (the architecture: below)
  std::vector<std::string> overrides;  // --set k=v
  std::string checkpoint;              // "" = the newest in the config's output_dir
  std::string dump_logits;             // "" = none; else a safetensors file (tokens, logits)
};

// Evaluates a checkpoint on the validation split: {"checkpoint", "step", "loss", "perplexity",
// "accuracy", "tokens", "majority_baseline", "expert_imbalance"}. The model's architecture is
// the checkpoint's: model/moe keys the config leaves out are taken from it; a contradicting
// one is refused naming the key.
nlohmann::json eval_checkpoint(const EvalRequest& req);

struct GenerateOptions {
  std::string checkpoint_dir;
  std::string prompt;
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 0;
  uint64_t seed = 1;
  std::string device = "auto";
};

// Byte-level text in, text out (the config is the one stored in the checkpoint).
std::string generate_text(const GenerateOptions& opt);

// The tensors of a checkpoint's safetensors files: {"model": {name: {"dtype", "shape"}}, ...}.
nlohmann::json describe_checkpoint(const std::string& dir);

}  // namespace moe::train
