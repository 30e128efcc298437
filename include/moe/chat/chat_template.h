// Hugging Face chat templates (tokenizer_config.json's "chat_template", or chat_template.jinja):
// the subset of Jinja2 that the families' templates use, rendered as transformers'
// apply_chat_template renders them (trim_blocks, lstrip_blocks, loop controls, macros,
// raise_exception, tojson as Python's json.dumps, {% generation %} blocks). Debian packages no
// C++ Jinja library; docs/data-format.md lists what is supported. Values are JSON (ordered, as
// Python dicts keep insertion order).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::chat {

class ChatTemplate {
 public:
  // Parses `source`; UserError naming `origin`, the line and what was expected on bad syntax or
  // an unsupported tag.
  ChatTemplate(const std::string& source, std::string origin);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;

  // Renders with `context` as the template's variables (messages, add_generation_prompt,
  // bos_token, eos_token, ...). `generation`, when given, receives the [begin, end) byte ranges
  // of the output rendered inside {% generation %} blocks. UserError on raise_exception or a
  // runtime error (naming `origin`).
  std::string render(const nlohmann::ordered_json& context,
                     std::vector<std::pair<size_t, size_t>>* generation = nullptr) const;

  struct Node;

 private:
  std::string origin_;
  std::vector<std::unique_ptr<Node>> body_;
};

// Python's json.dumps(value, ensure_ascii=False, indent=indent) (indent < 0: none), as
// transformers' tojson filter writes it.
std::string python_json_dumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace moe::chat
