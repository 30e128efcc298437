// The chat-template engine (chat_template.h) in rooms: template_lexer (text and tags, tokens),
// template_budget (the sandbox's limits; the blocks' nesting checked before anything else),
// template_expr_parser and template_parser (expressions and blocks), template_eval and
// template_eval_expr (the renderer), template_values (Python's str, repr and truthiness) and the
// builtins' tables (template_builtins: functions and tests, template_filters, template_methods).
#include "moe/chat/chat_template.h"

#include "moe/tokenizers/tokenizer.h"
#include "moe/util/errors.h"
#include "template_ast.h"
#include "template_budget.h"
#include "template_eval.h"
#include "template_lexer.h"
#include "template_parser.h"

namespace moe::chat {

ChatTemplate::ChatTemplate(const std::string& source, std::string origin)
    : origin_(std::move(origin)) {
  // transformers reads templates as UTF-8 text and fails on anything else.
  if (const size_t bad = tokenizers::first_invalid_utf8(source); bad != std::string::npos) {
    throw UserError("chat template: " + origin_ + ": not UTF-8 (byte " + std::to_string(bad) + ")");
  }
  try {
    // The blocks' nesting first, in one pass over the tags: a template nested far past the
    // limit is refused before the work of splitting and parsing it.
    check_block_nesting(source);
    body_ = parse_template(split_template(source));
  } catch (const SyntaxError& e) {
    throw UserError("chat template: " + origin_ + ":" + std::to_string(e.line) + ": " + e.what);
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const Json& context,
                                 std::vector<std::pair<size_t, size_t>>* generation) const {
  Renderer r(origin_, context, generation);
  try {
    r.run(body_);
  } catch (const Json::exception& e) {
    // A value of a type the operation does not take (Jinja2: a TypeError) that no check above
    // names better: still the template's error.
    throw UserError("chat template: " + origin_ + ": " + e.what());
  }
  return std::move(r.output());
}

}  // namespace moe::chat
