#include "moe/train/run_config.h"

#include <filesystem>

#include "moe/checkpoint/resume_policy.h"
#include "moe/config/architecture.h"
#include "moe/data/manifest.h"
#include "moe/hf/hf_config.h"
#include "moe/util/errors.h"

namespace moe::train {

namespace fs = std::filesystem;
using nlohmann::json;

json weights_architecture(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "state.json")) {
    const json saved = checkpoint::read_checkpoint_state(dir).config;
    json out = json::object();
    for (const char* s : {"model", "moe"}) {
      if (saved.contains(s)) out[s] = saved[s];
    }
    return out;
  }
  const fs::path hf = fs::path(dir) / "config.json";
  if (fs::exists(hf)) {
    return hf::architecture_from_hf(config::load_json_file(hf.string(), "hf"), hf.string(), nullptr,
                                    nullptr);
  }
  throw UserError("model.init_from = \"" + dir +
                  "\": neither a moe-train checkpoint (state.json) nor a Hugging Face model "
                  "directory (config.json)");
}

void fill_eod_from_manifest(json& root) {
  if (!root.contains("data") || !root["data"].is_object()) return;
  json& d = root["data"];
  if (d.value("reset_attention_at_eod", false) == true && !d.contains("eod_id") &&
      d.contains("path") && d["path"].is_string() && data::has_manifest(d["path"])) {
    const int64_t eod = data::load_manifest(d["path"].get<std::string>()).eod_id;
    if (eod >= 0) d["eod_id"] = eod;
  }
}

config::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                               int64_t world_size) {
  json root = config::load_json_file(path);
  for (const auto& o : overrides) config::apply_override(root, o);
  const json* model = root.contains("model") ? &root["model"] : nullptr;
  if (model != nullptr && model->is_object() && model->contains("init_from") &&
      (*model)["init_from"].is_string() && !(*model)["init_from"].get<std::string>().empty()) {
    try {
      config::fill_architecture(root,
                                weights_architecture((*model)["init_from"].get<std::string>()));
    } catch (const UserError& e) {
      throw UserError("config: " + path + ": " + e.what());
    }
  }
  fill_eod_from_manifest(root);
  config::Config cfg = config::from_json(root, path);
  cfg.world_size = world_size;
  config::validate(cfg);
  return cfg;
}

}  // namespace moe::train
