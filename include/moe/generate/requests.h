// What `moe-train generate` and `chat` are asked: the prompts (--prompt, --prompt-file, or a
// JSONL file of {"prompt": TEXT} / {"messages": [...]} requests), the checkpoint's tokenizer and
// chat template, and its generation defaults (generation_config.json, as transformers' generate
// reads them). LibTorch-free: everything here is checked before a model is loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/chat/sft.h"
#include "moe/generate/sampling_params.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::generate {

// One request, tokenized: `id` as the input line gave it (null when none), `where` names its
// origin for errors ("requests.jsonl line 3", "--prompt").
struct Request {
  nlohmann::ordered_json id;
  std::string where;
  std::vector<int64_t> ids;
  std::optional<int64_t> max_new_tokens;  // the line's own, else the command's
};

// The checkpoint's tokenizer: tokenizer.json (Hugging Face), else tokenizer.model
// (SentencePiece), else bytes for a byte-vocabulary model (vocab_size <= 256 and no tokenizer
// files). UserError naming the directory when it has none.
std::unique_ptr<tokenizers::Tokenizer> checkpoint_tokenizer(const std::string& dir,
                                                            int64_t vocab_size);

// The chat template and its variables (tokenizer_config.json, chat_template.jinja), or
// `template_file` in their place.
chat::ChatSetup checkpoint_chat(const std::string& dir, const std::string& template_file);

// `messages` rendered with the template (add_generation_prompt) as apply_chat_template does.
// UserError naming `where` when the checkpoint has no chat template.
std::string render_chat(const chat::ChatSetup& chat, const nlohmann::ordered_json& messages,
                        const std::string& where, bool enable_thinking = true);

// Plain text as transformers' tokenizer(text) encodes it: with the post-processor's special
// tokens (a BOS where the model has one).
std::vector<int64_t> encode_prompt(const tokenizers::Tokenizer& tok, const std::string& text);
// A rendered chat as apply_chat_template(tokenize=True) encodes it: no tokens added.
std::vector<int64_t> encode_rendered(const tokenizers::Tokenizer& tok, const std::string& text);

// The lines of a JSONL request file, checked and tokenized: UserError naming the file, the line
// and what was expected at the first bad one (invalid JSON, neither "prompt" nor "messages", a
// message without string role and content).
std::vector<Request> read_request_file(const std::string& path, const tokenizers::Tokenizer& tok,
                                       const chat::ChatSetup& chat);

// The generation defaults of a checkpoint directory: generation_config.json's sampling keys and
// its EOS and pad ids (else hf_config.json's, else the tokenizer's EOS), its context
// (max_position_embeddings, else `seq_len`).
struct GenerationDefaults {
  SamplingParams sampling;
  std::optional<int64_t> max_new_tokens, min_new_tokens;
  std::vector<int64_t> eos_ids;
  std::optional<int64_t> pad_id;
  int64_t context = 0;
};
// `tok` may be null (no tokenizer: no EOS from it).
GenerationDefaults read_generation_defaults(const std::string& dir,
                                            const tokenizers::Tokenizer* tok, int64_t seq_len);

}  // namespace moe::generate
