// libFuzzer target: arbitrary bytes as one line of prepare-data --format sft JSONL (messages,
// conversations, prompt/completion, tools), parsed and encoded with a ChatML template (assistant
// turns found from its generation prompt) and the byte tokenizer. A malformed line is skipped with
// a reason, a template that fails on it is a UserError; anything else (crash, sanitizer report,
// other exception, a mask that does not match the ids) is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/chat/sft.h"
#include "moe/tokenizers/tokenizer.h"
#include "moe/util/errors.h"

namespace {

constexpr const char* kChatMl =
    "{%- if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}"
    "{%- else %}{%- set content = message.content | tojson %}{%- endif %}"
    "<|im_start|>{{ message.role }}\n{{ content }}"
    "{%- if message.tool_calls %}{{ message.tool_calls | tojson }}{%- endif %}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<moe::tokenizers::Tokenizer> tok =
      moe::tokenizers::make_tokenizer("byte", "");
  static const moe::chat::SftEncoder enc = [] {
    moe::chat::ChatSetup chat;
    chat.chat_template.emplace(kChatMl, "chatml.jinja");
    chat.variables["eos_token"] = "\n";
    return moe::chat::SftEncoder(*tok, std::move(chat), {});
  }();
  const std::string line(reinterpret_cast<const char*>(data), size);
  std::string why;
  try {
    const std::optional<nlohmann::ordered_json> example = moe::chat::SftEncoder::parse(line, why);
    if (!example) return 0;
    const moe::chat::SftExample e = enc.encode(*example);
    if (e.ids.size() != e.mask.size()) __builtin_trap();
  } catch (const moe::UserError&) {
  } catch (
      const moe::tokenizers::InvalidUtf8Error&) {  // prepare-data reports the line (or replaces)
  }
  return 0;
}
