#include "moe/cli/generate_commands.h"

#include <CLI/CLI.hpp>

namespace moe::cli {

namespace {

// What generate and chat share: the checkpoint, sampling, stops, template and device.
void add_decoding_options(CLI::App* c, generate::DecodingFlags& f) {
  c->add_option("--checkpoint", f.checkpoint,
                "Checkpoint directory (full, LoRA, 4-bit base) or a Hugging Face model directory")
      ->required();
  c->add_option("-n,--max-new-tokens", f.max_new_tokens,
                "Tokens to generate (default: generation_config.json's, else 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--min-new-tokens", f.min_new_tokens,
                "No EOS before this many new tokens (default: generation_config.json's, else 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  c->add_option("--temperature", f.temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", f.top_k, "Keep the k most likely tokens; 0 = all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  c->add_option("--top-p", f.top_p, "Keep the most likely tokens up to this probability mass")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-p", f.min_p, "Drop tokens below min-p times the top probability")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--repetition-penalty", f.repetition_penalty,
                "Divide (multiply when negative) the logits of tokens seen so far")
      ->check(CLI::Range(0.01, 100.0));
  c->add_flag_callback(
      "--greedy", [&f] { f.do_sample = false; }, "Always take the most likely token");
  c->add_flag_callback(
      "--sample", [&f] { f.do_sample = true; }, "Sample (default: generation_config.json's)");
  c->add_option("--seed", f.seed, "Sampling seed");
  c->add_option("--stop", f.stop, "End a reply at this text (repeatable); not in the output");
  c->add_option("--chat-template", f.chat_template, "A .jinja chat template to use instead");
  c->add_option("--device", f.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

// generate: its options, into `gen`.
CLI::App* add_generate(CLI::App& app, generate::GenerateOptions& gen) {
  auto* gn = app.add_subcommand(
      "generate", "Continue prompts or chats with a checkpoint, its tokenizer and chat template");
  add_decoding_options(gn, gen);
  gn->add_option("--prompt", gen.prompt, "Text to continue (printed with its continuation)");
  gn->add_option("--prompt-file", gen.prompt_file, "A file whose whole text is the prompt");
  gn->add_option("--input", gen.input,
                 "JSONL requests, one a line: {\"prompt\": TEXT} or {\"messages\": [...]} "
                 "(chat template applied), optional \"id\" and \"max_new_tokens\"; writes JSONL");
  gn->add_option("-o,--output", gen.output, "Write the JSONL here (whole or not at all)");
  gn->add_flag("--jsonl", gen.jsonl, "--prompt / --prompt-file: JSONL output, not text");
  gn->add_option("--batch-size", gen.batch_size, "Requests generated together (left-padded)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  gn->add_option("--scores-out", gen.scores_out,
                 "Safetensors file of the first batch's processed scores per step [steps, B, V]");
  return gn;
}

// chat: its options, into `ch`.
CLI::App* add_chat(CLI::App& app, generate::ChatOptions& ch) {
  auto* c = app.add_subcommand(
      "chat", "Talk to a checkpoint in the terminal with its chat template (Ctrl-D ends)");
  add_decoding_options(c, ch);
  c->add_option("--system", ch.system, "A system message to start the conversation with");
  c->add_flag("--hide-thinking", ch.hide_thinking, "Do not show <think>...</think> blocks");
  c->add_flag("--no-thinking", ch.no_thinking, "Ask the template not to think (enable_thinking)");
  c->add_option("--transcript", ch.transcript,
                "Append each turn (rendered prompt, ids, reply) to this JSONL file");
  return c;
}

// bench-generate: its options, into `b`.
CLI::App* add_bench(CLI::App& app, generate::BenchGenerateOptions& b) {
  auto* c = app.add_subcommand(
      "bench-generate",
      "Inference speed: time to first token, prefill and decode tokens/s, peak memory");
  c->add_option("--checkpoint", b.checkpoint, "Checkpoint or Hugging Face model directory")
      ->required();
  c->add_option("--prompt-tokens", b.prompt_tokens, "Prompt length (random tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--new-tokens", b.new_tokens, "Tokens generated per row (EOS ignored)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  c->add_option("--batch", b.batches, "Batch sizes (default 1 8)")->delimiter(',');
  c->add_option("--rounds", b.rounds, "Timed rounds after one warm-up (medians)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  c->add_option("--threads", b.threads, "CPU threads (default: torch's)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  c->add_option("--device", b.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  c->add_flag("--json", b.json, "JSON instead of the table");
  return c;
}

}  // namespace

void add_generate_commands(CLI::App& app, GenerateCommands& c) {
  c.generate_app = add_generate(app, c.generate);
  c.chat_app = add_chat(app, c.chat);
  c.bench_app = add_bench(app, c.bench);
}

std::optional<int> run_generate_commands(const GenerateCommands& c) {
  if (*c.generate_app) return generate::run_generate(c.generate);
  if (*c.chat_app) return generate::run_chat(c.chat);
  if (*c.bench_app) return generate::run_bench_generate(c.bench);
  return std::nullopt;
}

}  // namespace moe::cli
