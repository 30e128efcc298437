#include "moe/hf/hf_files.h"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/util/errors.h"

namespace moe::hf {

namespace fs = std::filesystem;
using nlohmann::json;

HfWeights::HfWeights(const std::string& dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index_path)) {
    if (!fs::exists(single)) {
      const bool bin = fs::exists(fs::path(dir) / "pytorch_model.bin") ||
                       fs::exists(fs::path(dir) / "pytorch_model.bin.index.json");
      throw UserError("hf: " + dir + ": no model.safetensors or model.safetensors.index.json" +
                      (bin ? " (pickled pytorch_model.bin weights are not read: convert them to "
                             "safetensors)"
                           : ""));
    }
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& [name, e] : files_.back()->entries())
      tensors_[name] = {files_.back().get(), &e};
    return;
  }
  const json index = config::load_json_file(index_path.string(), "hf");
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw UserError("hf: " + index_path.string() + ": weight_map: expected an object");
  }
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      throw UserError("hf: " + index_path.string() + ": weight_map." + tensor +
                      ": expected a file name");
    }
    const std::string shard = file.get<std::string>();
    if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
      throw UserError("hf: " + index_path.string() + ": weight_map." + tensor + " = \"" + shard +
                      "\": expected a file name in the directory");
    }
    if (by_name.count(shard) == 0) {
      const fs::path p = fs::path(dir) / shard;
      if (!fs::exists(p)) {
        throw UserError("hf: " + p.string() + ": missing (the index puts '" + tensor + "' in it)");
      }
      files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
      by_name[shard] = files_.back().get();
    }
    const SafetensorsFile* f = by_name[shard];
    if (!f->has(tensor)) {
      throw UserError("hf: " + f->path() + ": has no tensor '" + tensor +
                      "' (model.safetensors.index.json puts it there)");
    }
    tensors_[tensor] = {f, &f->entry(tensor)};
  }
  for (const auto& f : files_) {
    for (const auto& [name, e] : f->entries()) {
      const auto it = tensors_.find(name);
      if (it == tensors_.end()) {
        throw UserError("hf: " + f->path() + ": tensor '" + name +
                        "' is not in model.safetensors.index.json");
      }
      if (it->second.file != f.get()) {
        throw UserError("hf: " + f->path() + ": tensor '" + name + "' is also in " +
                        it->second.file->path() +
                        " (model.safetensors.index.json puts it there); a tensor must be in one "
                        "shard");
      }
    }
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t parse_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, int64_t> kUnits = {{"", 1},
                                                        {"B", 1},
                                                        {"KB", 1000},
                                                        {"MB", 1000 * 1000},
                                                        {"GB", 1000LL * 1000 * 1000},
                                                        {"KIB", 1 << 10},
                                                        {"MIB", 1 << 20},
                                                        {"GIB", 1LL << 30}};
  auto u = kUnits.find(unit);
  if (i == 0 || i > 15 || u == kUnits.end() || std::stoll(text.substr(0, i)) <= 0) {
    throw UserError(what + " = \"" + text +
                    "\": expected a positive size such as 5GB, 500MB, 2GiB or a byte count");
  }
  return std::stoll(text.substr(0, i)) * u->second;
}

int64_t write_hf_weights(const std::string& dir, const std::vector<SafeTensorView>& tensors,
                         int64_t max_shard_bytes) {
  std::vector<std::vector<const SafeTensorView*>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    const auto bytes = static_cast<int64_t>(t.nbytes);
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  auto write = [&](const std::string& name, const std::vector<const SafeTensorView*>& shard) {
    std::vector<SafeTensorView> views;
    for (const auto* t : shard) views.push_back(*t);
    write_safetensors((fs::path(dir) / name).string(), views, meta);
  };
  if (shards.size() == 1) {
    write("model.safetensors", shards[0]);
    return 1;
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write(name, shards[i]);
    for (const auto* t : shards[i]) index["weight_map"][t->name] = name;
  }
  const std::string path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(path);
  out << index.dump(2) << "\n";
  out.flush();
  if (!out) throw TrainingError("export-hf: " + path + ": write failed (disk full?)");
  return static_cast<int64_t>(shards.size());
}

}  // namespace moe::hf
