// libFuzzer target: arbitrary bytes as a chat template (a downloaded tokenizer_config.json's
// "chat_template" or chat_template.jinja), parsed and rendered over a conversation with every
// kind of turn, tools and the usual variables. Syntax errors, raise_exception, runtime errors
// and the sandbox's budgets are UserErrors; anything else (crash, sanitizer report, other
// exception, a hang past libFuzzer's -timeout) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/chat/chat_template.h"
#include "moe/util/errors.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "What is 2+2? <b>&amp;</b> \u00e9\u65e5"},
      {"role": "assistant", "content": "", "reasoning_content": "think",
       "tool_calls": [{"type": "function", "function": {"name": "add",
                       "arguments": {"a": 2, "b": 2.5, "c": [true, null]}}}]},
      {"role": "tool", "content": "4"},
      {"role": "assistant", "content": [{"type": "text", "text": "It is 4."}]},
      {"role": "user", "content": ""}
    ],
    "tools": [{"type": "function", "function": {"name": "add", "description": "Adds.",
               "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                              "required": ["a"]}}}]
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const moe::chat::ChatTemplate t(source, "fuzz.jinja");
    std::vector<std::pair<size_t, size_t>> generation;
    const std::string out = t.render(context(), &generation);
    for (const auto& [begin, end] : generation) {
      if (begin > end || end > out.size()) __builtin_trap();  // ranges lie inside the output
    }
    (void)moe::chat::python_json_dumps(context(), 2);
  } catch (const moe::UserError&) {
  }
  return 0;
}
