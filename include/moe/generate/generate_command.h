// `moe-train generate`: a checkpoint (full, LoRA, a 4-bit base, MXFP4 experts, or a Hugging
// Face model directory) continues prompts with its own tokenizer and generation defaults.
// LibTorch stays behind this header so that the CLI remains a light translation unit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::generate {

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt, prompt_file, input;  // exactly one
  std::string output;                      // JSONL file ("" = stdout)
  bool jsonl = false;                      // --prompt / --prompt-file: JSONL, not text
  std::optional<int64_t> max_new_tokens, top_k;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<bool> do_sample;  // --greedy false, --sample true; else generation_config's
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string chat_template;  // a .jinja file in place of the checkpoint's
  int64_t batch_size = 8;
  std::string device = "auto";
  std::string scores_out;  // safetensors: the first batch's processed scores per step
};

// Runs the command; UserError (exit 2) for bad input, before anything is written.
int run_generate(const GenerateOptions& opt);

}  // namespace moe::generate
