// A checkpoint loaded for generation: its model (dropless routing, eval mode, on the chosen
// device), tokenizer, chat template and generation defaults. A Hugging Face model directory is
// imported into a temporary checkpoint first (removed when the session ends).
#pragma once

#include <memory>
#include <string>

#include "moe/chat/sft.h"
#include "moe/config/config.h"
#include "moe/generate/generate_command.h"
#include "moe/generate/generator.h"
#include "moe/generate/requests.h"
#include "moe/model/transformer.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::generate {

class GenerationSession {
 public:
  // flags.checkpoint, flags.device (auto | cpu | cuda), flags.chat_template. UserError for a
  // directory that is no checkpoint or HF model.
  // `need_tokenizer` false: a checkpoint without one loads (tokenizer stays null).
  explicit GenerationSession(const DecodingFlags& flags, bool need_tokenizer = true);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  config::Config cfg;
  model::TransformerLM model{nullptr};
  std::unique_ptr<tokenizers::Tokenizer> tokenizer;
  chat::ChatSetup chat;
  GenerationDefaults defaults;
  const std::string& dir() const { return dir_; }  // the checkpoint read
  // The flags over the checkpoint's defaults: sampling (--temperature 0 is greedy), and the
  // limits of a request with `max_new_tokens` (unset: the flags', generation_config.json's, 256).
  SamplingParams sampling() const;
  GenerationLimits limits(std::optional<int64_t> max_new_tokens = std::nullopt) const;

 private:
  DecodingFlags flags_;
  std::string dir_, imported_;  // imported_: the temporary import of an HF directory
};

}  // namespace moe::generate
