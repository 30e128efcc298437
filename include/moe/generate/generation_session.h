// A checkpoint loaded for generation: its model (dropless routing, eval mode, on the chosen
// device), tokenizer, chat template and generation defaults. A Hugging Face model directory is
// imported into a temporary checkpoint first (removed when the session ends).
#pragma once

#include <memory>
#include <string>

#include "moe/chat/sft.h"
#include "moe/config/config.h"
#include "moe/generate/requests.h"
#include "moe/model/transformer.h"
#include "moe/tokenizers/tokenizer.h"

namespace moe::generate {

class GenerationSession {
 public:
  // `device`: auto | cpu | cuda. UserError for a directory that is no checkpoint or HF model.
  GenerationSession(const std::string& dir, const std::string& device,
                    const std::string& chat_template = "");
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  config::Config cfg;
  model::TransformerLM model{nullptr};
  std::unique_ptr<tokenizers::Tokenizer> tokenizer;
  chat::ChatSetup chat;
  GenerationDefaults defaults;
  const std::string& dir() const { return dir_; }  // the checkpoint read

 private:
  std::string dir_, imported_;  // imported_: the temporary import of an HF directory
};

}  // namespace moe::generate
