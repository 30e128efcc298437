#include "moe/generate/generate_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/generate/generation_session.h"
#include "moe/generate/generator.h"
#include "moe/util/errors.h"
#include "moe/util/safetensors.h"

namespace moe::generate {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("generate: --prompt-file " + path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The command's requests, tokenized and checked against the context.
std::vector<Request> gather_requests(const GenerateOptions& opt, const GenerationSession& s) {
  const int given = !opt.prompt.empty() + !opt.prompt_file.empty() + !opt.input.empty();
  if (given != 1)
    throw UserError("generate: give exactly one of --prompt, --prompt-file and --input");
  std::vector<Request> requests;
  if (!opt.input.empty()) {
    requests = read_request_file(opt.input, *s.tokenizer, s.chat);
  } else {
    Request r;
    r.where = opt.prompt.empty() ? "--prompt-file " + opt.prompt_file : "--prompt";
    r.ids = encode_prompt(*s.tokenizer,
                          opt.prompt.empty() ? read_text_file(opt.prompt_file) : opt.prompt);
    if (r.ids.empty()) throw UserError("generate: " + r.where + ": the prompt has no tokens");
    requests.push_back(std::move(r));
  }
  for (const auto& r : requests) {
    for (int64_t id : r.ids) {
      if (id >= s.cfg.model.vocab_size) {
        throw UserError("generate: " + r.where + ": token id " + std::to_string(id) +
                        " is outside the model's " + std::to_string(s.cfg.model.vocab_size) +
                        "-token vocabulary (a tokenizer of another model?)");
      }
    }
    if (static_cast<int64_t>(r.ids.size()) >= s.defaults.context) {
      throw UserError("generate: " + r.where + ": the prompt has " + std::to_string(r.ids.size()) +
                      " tokens; the model's context is " + std::to_string(s.defaults.context) +
                      " (max_position_embeddings), leaving no room to generate");
    }
  }
  return requests;
}

// Ends a row when its text so far contains one of `stops`.
struct StopStrings {
  const tokenizers::Tokenizer& tok;
  const std::vector<std::string>& stops;
  std::vector<std::vector<int64_t>> ids;
  bool operator()(size_t row, int64_t token) {
    if (stops.empty()) return false;
    ids[row].push_back(token);
    const std::string text = tok.decode(ids[row], true);
    for (const auto& s : stops) {
      if (text.find(s) != std::string::npos) return true;
    }
    return false;
  }
};

// The generated text, cut before the first stop string it contains.
std::string cut_at_stop(std::string text, const std::vector<std::string>& stops) {
  size_t cut = std::string::npos;
  for (const auto& s : stops) cut = std::min(cut, text.find(s));
  if (cut != std::string::npos) text.resize(cut);
  return text;
}

void write_scores(const std::string& path, const std::vector<torch::Tensor>& steps) {
  const auto all = torch::stack(steps).contiguous();  // [steps, B, V]
  write_safetensors(
      path,
      {{"scores", "F32", all.sizes().vec(), all.data_ptr(), static_cast<size_t>(all.nbytes())}},
      {{"format", "pt"}, {"producer", "moe-train generate"}});
}

// Writes `text` to `path` whole or not at all (a sibling temporary renamed into place).
void write_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError("generate: --output " + path + ": cannot write");
    out << text;
    if (!out.flush()) throw UserError("generate: --output " + path + ": write failed");
  }
  fs::rename(tmp, path);
}

}  // namespace

int run_generate(const GenerateOptions& opt) {
  if (opt.batch_size < 1) throw UserError("generate: --batch-size must be at least 1");
  GenerationSession s(opt);
  const std::vector<Request> requests = gather_requests(opt, s);
  const SamplingParams sampling = s.sampling();
  std::string out;
  std::vector<torch::Tensor> scores;
  // Requests with the same budget share a batch, in input order.
  for (size_t first = 0; first < requests.size();) {
    const GenerationLimits limits = s.limits(requests[first].max_new_tokens);
    size_t last = first;
    std::vector<std::vector<int64_t>> prompts;
    while (last < requests.size() && static_cast<int64_t>(prompts.size()) < opt.batch_size &&
           s.limits(requests[last].max_new_tokens).max_new_tokens == limits.max_new_tokens) {
      prompts.push_back(requests[last++].ids);
    }
    StopStrings stops{*s.tokenizer, opt.stop, std::vector<std::vector<int64_t>>(prompts.size())};
    const auto generated =
        generate_batch(s.model, prompts, sampling, limits, TokenCallback(stops),
                       first == 0 && !opt.scores_out.empty() ? &scores : nullptr);
    for (size_t i = 0; i < generated.size(); ++i) {
      const Request& r = requests[first + i];
      const std::string text = cut_at_stop(s.tokenizer->decode(generated[i].ids, true), opt.stop);
      if (!opt.input.empty() || opt.jsonl) {
        Json line;
        if (!r.id.is_null()) line["id"] = r.id;
        line["text"] = text;
        line["token_ids"] = generated[i].ids;
        line["finish_reason"] = generated[i].finish_reason;
        line["prompt_tokens"] = r.ids.size();
        out += line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
      } else {
        out += (opt.prompt.empty() ? read_text_file(opt.prompt_file) : opt.prompt) + text + "\n";
      }
    }
    first = last;
  }
  if (!opt.scores_out.empty()) write_scores(opt.scores_out, scores);
  if (opt.output.empty()) {
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    write_whole(opt.output, out);
  }
  return 0;
}

}  // namespace moe::generate
