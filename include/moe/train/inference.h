// `moe-train eval` and `moe-train checkpoint info`, with LibTorch kept
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

// The tensors of a checkpoint's safetensors files: {"model": {name: {"dtype", "shape"}}, ...}.
nlohmann::json describe_checkpoint(const std::string& dir);

}  // namespace moe::train
