#include "moe/checkpoint/side_files.h"

#include <filesystem>

namespace moe::checkpoint {

namespace fs = std::filesystem;

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> kNames = {"tokenizer.json",
                                                  "tokenizer_config.json",
                                                  "special_tokens_map.json",
                                                  "tokenizer.model",
                                                  "vocab.json",
                                                  "merges.txt",
                                                  "added_tokens.json",
                                                  "chat_template.jinja",
                                                  "chat_template.json"};
  return kNames;
}

std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to) {
  std::vector<std::string> copied;
  for (const auto& name : tokenizer_file_names()) {
    const fs::path src = fs::path(from) / name;
    if (!fs::is_regular_file(src)) continue;
    fs::copy_file(src, fs::path(to) / name, fs::copy_options::overwrite_existing);
    copied.push_back(name);
  }
  return copied;
}

std::string hf_side_source(const std::string& dir) {
  if (dir.empty()) return "";
  const fs::path d = dir;
  if (fs::is_regular_file(d / "hf_config.json")) return dir;
  if (fs::is_regular_file(d / "config.json") && !fs::exists(d / "state.json")) return dir;
  return "";
}

void copy_hf_side_files(const std::string& from, const std::string& to) {
  const fs::path src = from, dst = to;
  const auto copy = fs::copy_options::overwrite_existing;
  fs::copy_file(
      fs::is_regular_file(src / "hf_config.json") ? src / "hf_config.json" : src / "config.json",
      dst / "hf_config.json", copy);
  for (const char* name : {"generation_config.json", "moe-train.json"}) {
    if (fs::is_regular_file(src / name)) fs::copy_file(src / name, dst / name, copy);
  }
  if (const fs::path carried = src / kCarriedTensorsFile; fs::is_regular_file(carried)) {
    std::error_code linked;
    fs::remove(dst / kCarriedTensorsFile);
    fs::create_hard_link(carried, dst / kCarriedTensorsFile, linked);
    if (linked) fs::copy_file(carried, dst / kCarriedTensorsFile, copy);
  }
  copy_tokenizer_files(from, to);
}

}  // namespace moe::checkpoint
