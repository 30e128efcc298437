// `moe-train chat`: the checkpoint's chat template over the conversation so far, a reply streamed
// token by token, turn after turn.
#include <cstdio>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "moe/generate/generate_command.h"
#include "moe/generate/generation_session.h"
#include "moe/generate/terminal_input.h"
#include "moe/util/errors.h"

namespace moe::generate {

namespace {

using Json = nlohmann::ordered_json;

// The reply's text as it grows, printed as far as it is whole: a character cut between tokens
// (U+FFFD at the end) waits for its next token; with `hide_thinking` what lies inside
// <think>...</think> is not shown.
class ReplyPrinter {
 public:
  ReplyPrinter(const tokenizers::Tokenizer& tok, bool hide_thinking)
      : tok_(tok), hide_(hide_thinking) {}
  void add(int64_t token) {
    ids_.push_back(token);
    const std::string text = tok_.decode(ids_, true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    show(text);
  }
  // The end of the reply: whatever was held back is shown as it decodes.
  void finish() { show(tok_.decode(ids_, true)); }
  const std::vector<int64_t>& ids() const { return ids_; }

 private:
  void show(const std::string& text) {
    const std::string shown = hide_ ? without_thinking(text) : text;
    if (shown.size() > printed_ && shown.compare(0, printed_, shown, 0, printed_) == 0) {
      std::fwrite(shown.data() + printed_, 1, shown.size() - printed_, stdout);
      std::fflush(stdout);
      printed_ = shown.size();
    }
  }
  static std::string without_thinking(const std::string& text) {
    std::string out;
    size_t at = 0;
    while (true) {
      const size_t open = text.find("<think>", at);
      out += text.substr(at, open == std::string::npos ? std::string::npos : open - at);
      if (open == std::string::npos) break;
      const size_t close = text.find("</think>", open);
      if (close == std::string::npos) break;  // still thinking
      at = close + 8;
      while (at < text.size() && text[at] == '\n') ++at;
    }
    return out;
  }
  const tokenizers::Tokenizer& tok_;
  bool hide_;
  std::vector<int64_t> ids_;
  size_t printed_ = 0;
};

// The reply as history keeps it: the decoded text, cut before a stop string.
std::string reply_text(const tokenizers::Tokenizer& tok, const std::vector<int64_t>& ids,
                       const std::vector<std::string>& stops) {
  std::string text = tok.decode(ids, true);
  for (const auto& s : stops) {
    if (const size_t at = text.find(s); at != std::string::npos) text.resize(at);
  }
  return text;
}

}  // namespace

int run_chat(const ChatOptions& opt) {
  GenerationSession s(opt);
  if (!s.chat.chat_template) {
    throw UserError("chat: " + opt.checkpoint +
                    ": no chat template (tokenizer_config.json chat_template or "
                    "chat_template.jinja); give --chat-template FILE");
  }
  std::ofstream transcript;
  if (!opt.transcript.empty()) {
    transcript.open(opt.transcript, std::ios::app);
    if (!transcript) throw UserError("chat: --transcript " + opt.transcript + ": cannot write");
  }
  Json messages = Json::array();
  if (!opt.system.empty()) messages.push_back({{"role", "system"}, {"content", opt.system}});
  const SamplingParams sampling = s.sampling();
  const GenerationLimits limits = s.limits();
  InterruptibleInput input;
  for (int64_t turn = 1;; ++turn) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    const std::optional<std::string> got = input.read_line();
    if (!got || input.interrupted()) break;  // Ctrl-D, or Ctrl-C at the prompt
    const std::string& line = *got;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string prompt =
        render_chat(s.chat, messages, "chat turn " + std::to_string(turn), !opt.no_thinking);
    const std::vector<int64_t> ids = encode_rendered(*s.tokenizer, prompt);
    ReplyPrinter printer(*s.tokenizer, opt.hide_thinking);
    std::vector<int64_t> so_far;
    const auto generated =
        generate_batch(s.model, {ids}, sampling, limits, [&](size_t, int64_t token) {
          printer.add(token);
          so_far.push_back(token);
          if (input.interrupted()) return true;  // Ctrl-C ends this reply
          const std::string text = s.tokenizer->decode(so_far, true);
          for (const auto& stop : opt.stop) {
            if (text.find(stop) != std::string::npos) return true;
          }
          return false;
        });
    printer.finish();
    std::fputs(input.interrupted() ? " [stopped]\n" : "\n", stdout);
    std::fflush(stdout);
    input.clear();
    const std::string reply = reply_text(*s.tokenizer, generated[0].ids, opt.stop);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    if (transcript) {
      transcript << Json{{"turn", turn},
                         {"prompt", prompt},
                         {"prompt_ids", ids},
                         {"reply", reply},
                         {"reply_ids", generated[0].ids},
                         {"finish_reason", generated[0].finish_reason}}
                        .dump(-1, ' ', false, Json::error_handler_t::replace)
                 << "\n"
                 << std::flush;
    }
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace moe::generate
