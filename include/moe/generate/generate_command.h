// `moe-train generate` and `moe-train chat`: a checkpoint (full, LoRA, a 4-bit base, MXFP4 experts,
// or a Hugging Face model directory) continues prompts with its own tokenizer and generation
// defaults. LibTorch stays behind this header so that the CLI remains a light translation unit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::generate {

// What generate and chat share: the checkpoint, sampling (unset: generation_config.json's,
// else transformers' defaults), stops, the template and the device.
struct DecodingFlags {
  std::string checkpoint;
  std::optional<int64_t> max_new_tokens, min_new_tokens, top_k;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<bool> do_sample;  // --greedy false, --sample true
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string chat_template;  // a .jinja file in place of the checkpoint's
  std::string device = "auto";
};

struct GenerateOptions : DecodingFlags {
  std::string prompt, prompt_file, input;  // exactly one
  std::string output;                      // JSONL file ("" = stdout)
  bool jsonl = false;                      // --prompt / --prompt-file: JSONL, not text
  int64_t batch_size = 8;
  std::string scores_out;  // safetensors: the first batch's processed scores per step
};

struct ChatOptions : DecodingFlags {
  std::string system;          // a system message first ("" = none)
  bool hide_thinking = false;  // <think>...</think> not shown (kept in what the model sees)
  bool no_thinking = false;    // the template's enable_thinking = false
  std::string transcript;      // JSONL: per turn the rendered prompt, its ids and the reply
};

struct BenchGenerateOptions {
  std::string checkpoint, device = "auto";
  int64_t prompt_tokens = 128, new_tokens = 64, rounds = 3, threads = 0;  // threads 0: torch's
  std::vector<int64_t> batches = {1, 8};
  bool json = false;
};

// Runs the command; UserError (exit 2) for bad input, before anything is written.
int run_generate(const GenerateOptions& opt);
// The interactive chat: a turn per line of input, the reply streamed as it is generated. Ends
// with exit 0 at end of input (Ctrl-D) or Ctrl-C at the prompt; Ctrl-C while a reply streams
// ends that reply.
int run_chat(const ChatOptions& opt);
// Inference speed on the current device: per batch size, greedy generation of `new_tokens` after
// random prompts of `prompt_tokens` (EOS ignored), one warm-up then `rounds` timed, medians:
// prefill tokens/s, time to first token, decode tokens/s, peak memory.
int run_bench_generate(const BenchGenerateOptions& opt);

}  // namespace moe::generate
