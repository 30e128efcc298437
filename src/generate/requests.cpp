#include "moe/generate/requests.h"

#include <filesystem>
#include <fstream>

#include "moe/util/errors.h"
#include "moe/util/input_limits.h"
#include "moe/util/json_nesting.h"

namespace moe::generate {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// A JSON file of the checkpoint, or null when absent. UserError naming it when unreadable.
nlohmann::json read_optional_json(const fs::path& path) {
  if (!fs::is_regular_file(path)) return nullptr;
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (json_nests_deeper_than(text))
    throw UserError("generate: " + path.string() + ": JSON nested too deeply");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("generate: " + path.string() + ": invalid JSON: " + e.what());
  }
}

// An id or a list of ids (eos_token_id's two forms).
std::vector<int64_t> id_list(const nlohmann::json& v) {
  std::vector<int64_t> ids;
  if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  if (v.is_array()) {
    for (const auto& x : v) {
      if (x.is_number_integer()) ids.push_back(x.get<int64_t>());
    }
  }
  return ids;
}

// `key` of the HF config, or of its text_config (vision-language releases).
nlohmann::json text_key(const nlohmann::json& hf, const char* key) {
  if (hf.is_object() && hf.contains(key) && !hf[key].is_null()) return hf[key];
  if (hf.is_object() && hf.contains("text_config") && hf["text_config"].is_object())
    return text_key(hf["text_config"], key);
  return nullptr;
}

void read_sampling(const nlohmann::json& g, GenerationDefaults& d) {
  auto& s = d.sampling;
  if (g.contains("do_sample") && g["do_sample"].is_boolean()) s.do_sample = g["do_sample"];
  if (g.contains("temperature") && g["temperature"].is_number()) s.temperature = g["temperature"];
  if (g.contains("top_k") && g["top_k"].is_number_integer()) s.top_k = g["top_k"];
  if (g.contains("top_p") && g["top_p"].is_number()) s.top_p = g["top_p"];
  if (g.contains("min_p") && g["min_p"].is_number()) s.min_p = g["min_p"].get<double>();
  if (g.contains("repetition_penalty") && g["repetition_penalty"].is_number())
    s.repetition_penalty = g["repetition_penalty"];
  if (g.contains("max_new_tokens") && g["max_new_tokens"].is_number_integer())
    d.max_new_tokens = g["max_new_tokens"].get<int64_t>();
  if (g.contains("min_new_tokens") && g["min_new_tokens"].is_number_integer())
    d.min_new_tokens = g["min_new_tokens"].get<int64_t>();
}

// Why a request line is not one; "" when it is.
std::string request_problem(const Json& j) {
  if (!j.is_object()) return "expected a JSON object";
  const bool prompt = j.contains("prompt"), messages = j.contains("messages");
  if (prompt == messages) return "expected one of \"prompt\" (a string) or \"messages\" (a list)";
  if (prompt && !j["prompt"].is_string()) return "\"prompt\" is not a string";
  if (messages) {
    const Json& m = j["messages"];
    if (!m.is_array() || m.empty()) return "\"messages\" is not a non-empty list";
    for (size_t i = 0; i < m.size(); ++i) {
      if (!m[i].is_object() || !m[i].contains("role") || !m[i]["role"].is_string())
        return "messages[" + std::to_string(i) + "] has no string \"role\"";
    }
  }
  if (j.contains("max_new_tokens") &&
      (!j["max_new_tokens"].is_number_integer() || j["max_new_tokens"].get<int64_t>() < 1))
    return "\"max_new_tokens\" is not a positive integer";
  return "";
}

}  // namespace

std::unique_ptr<tokenizers::Tokenizer> checkpoint_tokenizer(const std::string& dir,
                                                            int64_t vocab_size) {
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.json"))
    return tokenizers::make_tokenizer("hf", (fs::path(dir) / "tokenizer.json").string());
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.model"))
    return tokenizers::make_tokenizer("sentencepiece",
                                      (fs::path(dir) / "tokenizer.model").string());
  if (vocab_size <= 256) return tokenizers::make_tokenizer("byte", "");
  throw UserError("generate: " + dir +
                  ": no tokenizer.json or tokenizer.model (import-hf copies the model's; put the "
                  "tokenizer files of the model this checkpoint was trained from there)");
}

chat::ChatSetup checkpoint_chat(const std::string& dir, const std::string& template_file) {
  return chat::load_chat_setup(dir, template_file);
}

std::string render_chat(const chat::ChatSetup& chat, const Json& messages, const std::string& where,
                        bool enable_thinking) {
  if (!chat.chat_template) {
    throw UserError("generate: " + where +
                    ": chat messages, but the checkpoint has no chat template "
                    "(tokenizer_config.json chat_template or chat_template.jinja); give "
                    "--chat-template FILE");
  }
  Json ctx = chat.variables;
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = true;
  if (!enable_thinking) ctx["enable_thinking"] = false;
  return chat.chat_template->render(ctx);
}

std::vector<int64_t> encode_rendered(const tokenizers::Tokenizer& tok, const std::string& text) {
  std::vector<uint32_t> ids;
  tok.encode(text, ids);
  return {ids.begin(), ids.end()};
}

std::vector<int64_t> encode_prompt(const tokenizers::Tokenizer& tok, const std::string& text) {
  const auto special = tok.special_tokens();
  std::vector<int64_t> ids(special.before.begin(), special.before.end());
  for (int64_t id : encode_rendered(tok, text)) ids.push_back(id);
  ids.insert(ids.end(), special.after.begin(), special.after.end());
  return ids;
}

std::vector<Request> read_request_file(const std::string& path, const tokenizers::Tokenizer& tok,
                                       const chat::ChatSetup& chat) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("generate: --input " + path + ": cannot open");
  std::vector<Request> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(n);
    Json j;
    try {
      if (json_nests_deeper_than(line)) throw UserError("JSON nested too deeply");
      j = Json::parse(line);
    } catch (const std::exception& e) {
      throw UserError("generate: " + where + ": invalid JSON: " + e.what());
    }
    if (const std::string why = request_problem(j); !why.empty())
      throw UserError("generate: " + where + ": " + why);
    Request r;
    r.id = j.contains("id") ? j["id"] : Json();
    r.where = where;
    if (j.contains("max_new_tokens")) r.max_new_tokens = j["max_new_tokens"].get<int64_t>();
    r.ids = j.contains("prompt") ? encode_prompt(tok, j["prompt"].get<std::string>())
                                 : encode_rendered(tok, render_chat(chat, j["messages"], where));
    if (r.ids.empty()) throw UserError("generate: " + where + ": the prompt has no tokens");
    out.push_back(std::move(r));
  }
  if (out.empty()) throw UserError("generate: --input " + path + ": no requests in the file");
  return out;
}

GenerationDefaults read_generation_defaults(const std::string& dir,
                                            const tokenizers::Tokenizer* tok, int64_t seq_len) {
  GenerationDefaults d;
  const auto gen = read_optional_json(fs::path(dir) / "generation_config.json");
  const auto hf = read_optional_json(fs::path(dir) / "hf_config.json");
  if (gen.is_object()) read_sampling(gen, d);
  d.eos_ids = gen.is_object() && gen.contains("eos_token_id")
                  ? id_list(gen["eos_token_id"])
                  : id_list(text_key(hf, "eos_token_id"));
  if (d.eos_ids.empty() && tok && tok->eos_id() >= 0) d.eos_ids.push_back(tok->eos_id());
  for (const auto& pad :
       {gen.is_object() && gen.contains("pad_token_id") ? gen["pad_token_id"] : nlohmann::json(),
        text_key(hf, "pad_token_id")}) {
    if (!d.pad_id && pad.is_number_integer()) d.pad_id = pad.get<int64_t>();
  }
  const auto positions = text_key(hf, "max_position_embeddings");
  d.context = positions.is_number_integer() ? std::max(positions.get<int64_t>(), seq_len) : seq_len;
  return d;
}

}  // namespace moe::generate
