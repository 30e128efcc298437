// prepare-data --format sft: supervised fine-tuning examples (JSONL: OpenAI-style `messages`,
// ShareGPT `conversations`, or `prompt`/`completion`) -> token ids and a per-token loss mask
// (1 where the token is a training target: the assistant's answers).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/chat/chat_template.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::chat {

struct SftExample {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;  // one per id
};

// What a tokenizer directory says about chats: the chat template (chat_template.jinja, else
// tokenizer_config.json's "chat_template", the "default" one of a list) and the variables
// templates use (bos_token, eos_token).
struct ChatSetup {
  std::optional<ChatTemplate> chat_template;
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};
// `template_file` (a .jinja file), when given, replaces the directory's template. UserError for
// an unreadable or malformed file.
ChatSetup load_chat_setup(const std::string& dir, const std::string& template_file);

class SftEncoder {
 public:
  // `special`: the tokenizer's post-processor tokens, put around prompt/completion examples
  // (--add-special-tokens); chat templates write their own.
  SftEncoder(const tokenizers::Tokenizer& tok, ChatSetup chat, tokenizers::SpecialTokens special);

  // One JSONL line as an example, or nullopt with `why` (a malformed line: invalid JSON, no
  // messages or prompt/completion, a message without a string role, no assistant turn).
  static std::optional<nlohmann::ordered_json> parse(const std::string& line, std::string& why);
  // Thread-safe. UserError for a template that fails on this example.
  SftExample encode(const nlohmann::ordered_json& example) const;

 private:
  SftExample encode_chat(const nlohmann::ordered_json& messages, size_t first_trained,
                         const nlohmann::ordered_json& tools) const;
  SftExample encode_completion(const std::string& prompt, const std::string& completion) const;
  std::vector<std::pair<size_t, size_t>> assistant_spans(const nlohmann::ordered_json& messages,
                                                         const std::string& rendered,
                                                         const nlohmann::ordered_json& tools) const;
  size_t end_of_rendering_through(const nlohmann::ordered_json& earlier,
                                  const nlohmann::ordered_json& message,
                                  const std::string& rendered,
                                  const nlohmann::ordered_json& tools) const;
  std::pair<size_t, size_t> turn_within_history(const nlohmann::ordered_json& earlier,
                                                const nlohmann::ordered_json& message,
                                                const std::string& rendered,
                                                const std::string& prompt,
                                                const nlohmann::ordered_json& tools) const;
  std::string render(const nlohmann::ordered_json& messages, bool generation_prompt,
                     const nlohmann::ordered_json& tools,
                     std::vector<std::pair<size_t, size_t>>* generation = nullptr) const;
  // The index of the first token of `ids` (the whole text's) that is not also a token of
  // text[0, pos): a token straddling `pos` belongs to what follows.
  size_t token_at(const std::string& text, size_t pos, const std::vector<uint32_t>& ids) const;

  const tokenizers::Tokenizer& tok_;
  ChatSetup chat_;
  tokenizers::SpecialTokens special_;
  std::vector<std::string> turn_ends_;  // special tokens' texts: one ends an assistant turn
  int64_t eos_ = -1;                    // appended to prompt/completion examples
};

}  // namespace moe::chat
