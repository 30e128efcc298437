#include "moe/chat/sft.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/util/errors.h"
#include "moe/util/json_nesting.h"

namespace moe::chat {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using tokenizers::SpecialTokens;
using tokenizers::Tokenizer;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UserError("prepare-data: " + p.string() + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// bos_token / eos_token as tokenizer_config.json writes them: a string, or an AddedToken
// object with "content".
std::optional<std::string> token_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// Whether list is a non-empty list of messages, each with a string "role"; why says what is not.
bool check_messages(const Json& list, const char* key, std::string& why) {
  if (!list.is_array() || list.empty()) {
    why = std::string("\"") + key + "\" is not a non-empty list of messages";
    return false;
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_object() || !list[i].contains("role") || !list[i]["role"].is_string()) {
      why = std::string(key) + "[" + std::to_string(i) + "] has no string \"role\"";
      return false;
    }
  }
  return true;
}

// ShareGPT: {"from": "human" | "gpt" | "system", "value": ...} as {"role": ..., "content": ...}.
void sharegpt_to_roles(Json& messages) {
  for (auto& m : messages) {
    if (!m.is_object() || !m.contains("from")) continue;
    const std::string from = m["from"].is_string() ? m["from"].get<std::string>() : "";
    m = Json{{"role", from == "human" ? "user"
                      : from == "gpt" ? "assistant"
                                      : from},
             {"content", m.value("value", Json())}};
  }
}

// The messages as transformers' apply_chat_template hands them to the template: first each
// message's keys whose value is null are dropped (OpenAI-style data has "content": null beside
// "tool_calls"; a template then sees no content, as jinja2 renders a present None as "None"),
// then a message's reasoning, under whichever of reasoning_content, thinking, reasoning is set
// first, is given under both names templates read: "thinking" (a message's own "thinking" kept;
// the key first when it is new) and "reasoning_content" (appended when it is new), as
// transformers' {"thinking": r, **message, "reasoning_content": r}. GLM-4.5's and Qwen3's
// templates read reasoning_content, gpt-oss's thinking.
void as_transformers_passes(Json& messages) {
  for (auto& m : messages) {
    if (!m.is_object()) continue;
    Json kept = Json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_null()) kept[it.key()] = it.value();
    }
    const char* field = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"}) {
      if (kept.contains(k)) {
        field = k;
        break;
      }
    }
    if (field == nullptr) {
      m = std::move(kept);
      continue;
    }
    const Json reasoning = kept[field];
    Json aliased = Json::object();
    aliased["thinking"] = reasoning;
    for (auto it = kept.begin(); it != kept.end(); ++it) aliased[it.key()] = it.value();
    aliased["reasoning_content"] = reasoning;
    m = std::move(aliased);
  }
}

// A "messages" or ShareGPT "conversations" example into out, all of it trained; false (and
// why) when the messages are malformed.
bool read_conversation(const Json& j, Json& out, std::string& why) {
  const char* key = j.contains("messages") ? "messages" : "conversations";
  Json messages = j.at(key);
  if (std::string(key) == "conversations" && messages.is_array()) sharegpt_to_roles(messages);
  if (!check_messages(messages, key, why)) return false;
  as_transformers_passes(messages);
  out["messages"] = std::move(messages);
  out["first_trained"] = 0;
  return true;
}

// Conversational prompt/completion (TRL) into out: the completion's messages are trained.
bool read_prompt_completion_messages(const Json& p, const Json& c, Json& out, std::string& why) {
  if (!check_messages(p, "prompt", why) || !check_messages(c, "completion", why)) return false;
  Json messages = p;
  for (const auto& m : c) messages.push_back(m);
  as_transformers_passes(messages);
  out["messages"] = std::move(messages);
  out["first_trained"] = p.size();
  return true;
}

// The special tokens that can end an assistant's turn: all but harmony's (gpt-oss's) markers of
// a message's header, channel and body, which come before its end (<|end|>, <|return|>,
// <|call|>).
std::vector<std::string> turn_ending_tokens(std::vector<std::string> special) {
  static const char* const markers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"};
  std::erase_if(special, [](const std::string& t) {
    return std::find(std::begin(markers), std::end(markers), t) != std::end(markers);
  });
  return special;
}

// Whether an assistant message stands among the trained ones.
bool trains_an_assistant(const Json& out) {
  const Json& messages = out["messages"];
  bool trained = false;
  for (size_t i = out["first_trained"].get<size_t>(); i < messages.size(); ++i) {
    trained = trained || messages[i]["role"] == "assistant";
  }
  return trained;
}

}  // namespace

ChatSetup load_chat_setup(const std::string& dir, const std::string& template_file) {
  ChatSetup setup;
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  Json cfg = Json::object();
  if (!dir.empty() && fs::exists(config)) {
    const std::string text = read_file(config);
    if (json_nests_deeper_than(text)) {
      throw UserError("prepare-data: " + config.string() + ": JSON nested more than " +
                      std::to_string(max_json_nesting()) + " levels deep" +
                      raise_hint("json.nesting"));
    }
    try {
      cfg = Json::parse(text);
    } catch (const Json::exception& e) {
      throw UserError("prepare-data: " + config.string() + ": invalid JSON: " + e.what());
    }
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      if (cfg.contains(key)) {
        if (auto t = token_text(cfg[key])) setup.variables[key] = *t;
      }
    }
  }
  std::string source, origin;
  if (!template_file.empty()) {
    source = read_file(template_file), origin = template_file;
  } else if (!dir.empty() && fs::exists(fs::path(dir) / "chat_template.jinja")) {
    origin = (fs::path(dir) / "chat_template.jinja").string();
    source = read_file(origin);
  } else if (cfg.contains("chat_template")) {
    origin = config.string() + " chat_template";
    const Json& t = cfg["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: the "default" one, as transformers picks
      for (const auto& named : t) {
        if (named.value("name", "") == "default") source = named.value("template", "");
      }
      if (source.empty()) {
        throw UserError("prepare-data: " + config.string() +
                        ": chat_template is a list without a \"default\" entry");
      }
    } else {
      throw UserError("prepare-data: " + config.string() +
                      ": chat_template is neither a string nor a list of named templates");
    }
  }
  if (!source.empty()) setup.chat_template.emplace(source, origin);
  return setup;
}

SftEncoder::SftEncoder(const Tokenizer& tok, ChatSetup chat, SpecialTokens special)
    : tok_(tok),
      chat_(std::move(chat)),
      special_(std::move(special)),
      turn_ends_(turn_ending_tokens(tok.special_token_texts())),
      eos_(tok.eos_id()) {
  // The EOS a completion ends with: tokenizer_config.json's eos_token (Qwen3's <|im_end|>, as
  // TRL appends tokenizer.eos_token), else the tokenizer's own.
  if (chat_.variables.contains("eos_token")) {
    std::vector<uint32_t> ids;
    tok.encode(chat_.variables["eos_token"].get<std::string>(), ids);
    if (ids.size() == 1) eos_ = ids[0];
  }
}

std::optional<Json> SftEncoder::parse(const std::string& line, std::string& why) {
  if (json_nests_deeper_than(line)) {
    why = "JSON nested more than " + std::to_string(max_json_nesting()) + " levels deep" +
          raise_hint("json.nesting");
    return std::nullopt;
  }
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    why = std::string("invalid JSON: ") + e.what();
    return std::nullopt;
  }
  if (!j.is_object()) {
    why = "expected a JSON object";
    return std::nullopt;
  }
  Json out = Json::object();
  if (j.contains("messages") || j.contains("conversations")) {
    if (!read_conversation(j, out, why)) return std::nullopt;
  } else if (j.contains("prompt") && j.contains("completion")) {
    const Json& p = j["prompt"];
    const Json& c = j["completion"];
    if (p.is_string() && c.is_string()) {
      out["prompt"] = p;
      out["completion"] = c;
      return out;
    }
    if (!read_prompt_completion_messages(p, c, out, why)) return std::nullopt;
  } else {
    why = "expected \"messages\", \"conversations\" or \"prompt\" and \"completion\"";
    return std::nullopt;
  }
  if (!trains_an_assistant(out)) {
    why = "no assistant message to train on";
    return std::nullopt;
  }
  if (j.contains("tools")) out["tools"] = j["tools"];
  return out;
}

SftExample SftEncoder::encode(const Json& example) const {
  if (example.contains("prompt")) {
    return encode_completion(example["prompt"].get<std::string>(),
                             example["completion"].get<std::string>());
  }
  return encode_chat(example["messages"], example["first_trained"].get<size_t>(),
                     example.contains("tools") ? example["tools"] : Json());
}

std::string SftEncoder::render(const Json& messages, bool generation_prompt, const Json& tools,
                               std::vector<std::pair<size_t, size_t>>* generation) const {
  Json ctx = chat_.variables;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = generation_prompt;
  if (!tools.is_null()) ctx["tools"] = tools;
  return chat_.chat_template->render(ctx, generation);
}

size_t SftEncoder::token_at(const std::string& text, size_t pos,
                            const std::vector<uint32_t>& ids) const {
  if (pos == 0) return 0;
  if (pos >= text.size()) return ids.size();
  std::vector<uint32_t> prefix;
  tok_.encode(std::string_view(text).substr(0, pos), prefix);
  size_t n = 0;
  while (n < prefix.size() && n < ids.size() && prefix[n] == ids[n]) ++n;
  return n;
}

// An assistant turn whose generation prompt the history does not repeat whole: Gemma 4's
// prompt ends in an empty thought channel ("<|turn>model\n<|channel>thought\n<channel|>") that
// its history leaves out, MiniMax-M2's in "<think>\n". When the conversation renders the messages
// before the turn as they render alone and, where they end, has part of the prompt (not all of
// it), the turn starts after that part ("<|turn>model\n") and ends where the rendering through
// this message ends (white space after its end-of-turn token not included), its tool calls
// inside; where the rendering through this message is not the conversation's beginning
// (MiniMax-M2 shows a last turn's reasoning, not an earlier one's), the end is npos: the caller
// ends the turn at its first end-of-turn token. Else {npos, npos}: the turn is found by its whole
// prompt.
constexpr size_t kNone = std::string::npos;

std::pair<size_t, size_t> SftEncoder::turn_within_history(const Json& earlier, const Json& message,
                                                          const std::string& rendered,
                                                          const std::string& prompt,
                                                          const Json& tools) const {
  const std::string head = render(earlier, false, tools);
  if (rendered.compare(0, head.size(), head) != 0) return {kNone, kNone};
  size_t common = 0;
  while (common < prompt.size() && head.size() + common < rendered.size() &&
         prompt[common] == rendered[head.size() + common]) {
    ++common;
  }
  if (common == 0 || common == prompt.size()) return {kNone, kNone};
  const size_t begin = head.size() + common;
  const size_t end = end_of_rendering_through(earlier, message, rendered, tools);
  return {begin, end > begin ? end : kNone};
}

// Where the conversation's rendering through `message` ends (white space after it left out), or 0
// when the conversation does not begin with that rendering. A turn ends no earlier: special tokens
// inside it (Kimi-K2's <think></think> before the answer, <|tool_calls_section_begin|>) are not its
// end, which is what the template writes after the message (<|im_end|>).
size_t SftEncoder::end_of_rendering_through(const Json& earlier, const Json& message,
                                            const std::string& rendered, const Json& tools) const {
  Json through = earlier;
  through.push_back(message);
  const std::string upto = render(through, false, tools);
  if (rendered.compare(0, upto.size(), upto) != 0) return 0;
  return upto.find_last_not_of(" \t\r\n") + 1;
}

// Where the assistant turns of the rendered conversation are, as byte ranges: the template's
// {% generation %} blocks when it has them (as transformers' return_assistant_tokens_mask);
// else each turn runs from its start to the end of the first special token after it (the turn's
// end: <|im_end|>, </s>, <|eot_id|>, an EOS, harmony's <|end|>), inclusive. A turn starts at the
// end of the template's generation prompt (the text add_generation_prompt appends, e.g.
// "<|im_start|>assistant\n"); a template without one (Mixtral's: the answer follows
// "[/INST]") starts it where the rendering of the messages before it ends. When the generation
// prompt follows the turn's end again (white space between) and the next message is not an
// assistant's, the turn goes on through that part too: the model writes it (gpt-oss's harmony
// format renders one assistant message as its analysis then its final answer or tool call, each
// opened by "<|start|>assistant").
std::vector<std::pair<size_t, size_t>> SftEncoder::assistant_spans(const Json& messages,
                                                                   const std::string& rendered,
                                                                   const Json& tools) const {
  size_t first = 0;
  while (messages[first]["role"] != "assistant") ++first;
  Json before = Json::array();
  for (size_t i = 0; i < first; ++i) before.push_back(messages[i]);
  const std::string without = render(before, false, tools), with = render(before, true, tools);
  if (with.size() < without.size() || with.compare(0, without.size(), without) != 0) {
    throw UserError(
        "the chat template's generation prompt is not text appended to the conversation; give a "
        "template with {% generation %} blocks (--chat-template)");
  }
  const std::string prompt = with.substr(without.size());
  auto first_end = [&](size_t begin) {
    size_t end = rendered.size();
    for (const auto& t : turn_ends_) {
      const size_t hit = rendered.find(t, begin);
      if (hit != std::string::npos) end = std::min(end, hit + t.size());
    }
    return end;
  };
  // The end of the turn starting at `begin`, through the parts of it that follow (above).
  auto turn_end = [&](size_t begin, bool last_of_run) {
    size_t end = first_end(begin);
    while (last_of_run && !prompt.empty()) {
      const size_t next = rendered.find_first_not_of(" \t\r\n", end);
      if (next == std::string::npos || rendered.compare(next, prompt.size(), prompt) != 0) break;
      end = first_end(next + prompt.size());
    }
    return end;
  };
  std::vector<std::pair<size_t, size_t>> spans;
  size_t from = 0;
  Json earlier = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (m["role"] == "assistant") {
      const auto [partial_begin, partial_end] =
          prompt.empty() ? std::pair{kNone, kNone}
                         : turn_within_history(earlier, m, rendered, prompt, tools);
      const bool last_of_run = i + 1 == messages.size() || messages[i + 1]["role"] != "assistant";
      if (partial_begin != kNone) {
        const size_t end =
            partial_end != kNone ? partial_end : turn_end(partial_begin, last_of_run);
        spans.emplace_back(partial_begin, end);
        from = end;
        earlier.push_back(m);
        continue;
      }
      size_t begin = 0;
      if (!prompt.empty()) {
        const size_t at = rendered.find(prompt, from);
        if (at == std::string::npos) {
          throw UserError("the chat template's output has " + std::to_string(spans.size()) +
                          " assistant turn(s) after its generation prompt where the example has "
                          "more");
        }
        begin = at + prompt.size();
      } else {
        const std::string head = render(earlier, false, tools);
        if (rendered.compare(0, head.size(), head) != 0) {
          throw UserError(
              "the chat template has no generation prompt and renders the messages before an "
              "assistant turn differently inside the conversation; give a template with "
              "{% generation %} blocks (--chat-template)");
        }
        begin = head.size();
      }
      spans.emplace_back(begin, std::max(turn_end(begin, last_of_run),
                                         end_of_rendering_through(earlier, m, rendered, tools)));
      from = spans.back().second;
    }
    earlier.push_back(m);
  }
  return spans;
}

SftExample SftEncoder::encode_chat(const Json& messages, size_t first_trained,
                                   const Json& tools) const {
  if (!chat_.chat_template) {
    throw UserError(
        "chat examples need a chat template: the tokenizer directory has none "
        "(tokenizer_config.json \"chat_template\" or chat_template.jinja); give --chat-template "
        "FILE");
  }
  std::vector<std::pair<size_t, size_t>> generation;
  const std::string text = render(messages, false, tools, &generation);
  std::vector<std::pair<size_t, size_t>> spans =
      generation.empty() ? assistant_spans(messages, text, tools) : generation;
  // The assistant turns in order; those of a conversational prompt are not trained.
  size_t skip = 0;
  for (size_t i = 0; i < first_trained; ++i) skip += messages[i]["role"] == "assistant" ? 1 : 0;
  SftExample ex;
  tok_.encode(text, ex.ids);
  ex.mask.assign(ex.ids.size(), 0);
  for (size_t s = skip; s < spans.size(); ++s) {
    const size_t b = token_at(text, spans[s].first, ex.ids);
    const size_t e = token_at(text, spans[s].second, ex.ids);
    std::fill(ex.mask.begin() + static_cast<std::ptrdiff_t>(b),
              ex.mask.begin() + static_cast<std::ptrdiff_t>(std::max(b, e)), 1);
  }
  return ex;
}

// TRL's prompt-completion format: the ids of prompt + completion, the completion's trained,
// then the EOS (trained: the model learns to stop), unless the completion already ends in it.
SftExample SftEncoder::encode_completion(const std::string& prompt,
                                         const std::string& completion) const {
  SftExample ex;
  ex.ids = special_.before;
  ex.mask.assign(ex.ids.size(), 0);
  const std::string text = prompt + completion;
  std::vector<uint32_t> ids;
  tok_.encode(text, ids);
  const size_t b = token_at(text, prompt.size(), ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    ex.ids.push_back(ids[i]);
    ex.mask.push_back(i >= b ? 1 : 0);
  }
  std::vector<uint32_t> after = special_.after;
  const int64_t eos = eos_;
  if (eos >= 0 &&
      std::find(after.begin(), after.end(), static_cast<uint32_t>(eos)) == after.end() &&
      (ex.ids.empty() || ex.ids.back() != static_cast<uint32_t>(eos))) {
    after.push_back(static_cast<uint32_t>(eos));
  }
  for (uint32_t id : after) {
    ex.ids.push_back(id);
    ex.mask.push_back(1);
  }
  return ex;
}

}  // namespace moe::chat
