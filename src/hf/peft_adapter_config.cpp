#include "moe/hf/peft_adapter_config.h"

#include <filesystem>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"

namespace moe::hf {

namespace fs = std::filesystem;
using nlohmann::json;

config::LoraConfig lora_config_from_peft(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::exists(path))
    throw UserError("import-hf --adapter: " + dir + ": no adapter_config.json");
  const json j = config::load_json_file(path, "import-hf --adapter");
  auto fail = [&](const std::string& key, const std::string& what) {
    return UserError("import-hf --adapter: " + path + ": " + key + ": " + what);
  };
  try {
    if (j.value("peft_type", std::string()) != "LORA") throw fail("peft_type", "expected \"LORA\"");
    for (const char* key : {"use_dora", "fan_in_fan_out"}) {
      if (j.value(key, false)) throw fail(key, "not supported (expected false)");
    }
    if (j.contains("layers_to_transform") && !j["layers_to_transform"].is_null()) {
      throw fail("layers_to_transform", "not supported (expected null: every layer)");
    }
    config::LoraConfig l;
    l.r = j.at("r").get<int64_t>();
    // PEFT's ranks are small positive integers; past 2^20 the doubled rank below would overflow.
    if (l.r < 1 || l.r > (int64_t{1} << 20))
      throw fail("r", "expected an integer from 1 to 1048576");
    l.lora_alpha = j.at("lora_alpha").get<double>();
    l.lora_dropout = j.value("lora_dropout", 0.0);
    l.use_rslora = j.value("use_rslora", false);
    l.target_modules.clear();
    const json modules = j.value("target_modules", json::array());
    if (!modules.is_array()) throw fail("target_modules", "expected a list of module names");
    for (const auto& m : modules) {
      const std::string name = m.get<std::string>();
      // in_proj: a Mamba mixer's; in_proj_* and out_proj: Gated DeltaNet's; shared_expert_gate:
      // the gated shared expert's (Qwen3-Next, Qwen3.5).
      // clang-format off
      static const std::set<std::string> kModules = {
          "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
          "kv_b_proj", "in_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
          "in_proj_qkvz", "in_proj_ba", "out_proj", "shared_expert_gate"};
      // clang-format on
      if (!kModules.contains(name)) {
        throw fail("target_modules", "\"" + name +
                                         "\": expected q_proj, k_proj, v_proj, o_proj, "
                                         "q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, "
                                         "in_proj, Gated DeltaNet's in_proj_qkv, in_proj_z, "
                                         "in_proj_b, in_proj_a, in_proj_qkvz, in_proj_ba, "
                                         "out_proj or shared_expert_gate (experts: "
                                         "target_parameters)");
      }
      l.target_modules.push_back(name);
    }
    const json params = j.value("target_parameters", json::array());
    const json ranks = j.value("rank_pattern", json::object());
    for (const auto& p : params.is_null() ? json::array() : params) {
      const std::string name = p.get<std::string>();
      if (name.ends_with("experts.gate_up_proj")) {
        const bool doubled = !ranks.empty() && ranks.begin()->get<int64_t>() == 2 * l.r;
        if (doubled) {
          l.target_modules.insert(l.target_modules.end(), {"gate_proj", "up_proj"});
        } else {
          l.target_modules.push_back("gate_up_proj");
        }
      } else if (name.ends_with("experts.down_proj")) {
        l.target_modules.push_back("down_proj");
      } else if (name.ends_with("experts.up_proj")) {  // Nemotron-H's non-gated experts
        l.target_modules.push_back("up_proj");
      } else {
        throw fail("target_parameters", "\"" + name +
                                            "\": expected mlp.experts.gate_up_proj, "
                                            "mlp.experts.down_proj or mixer.experts.up_proj");
      }
    }
    if (j.contains("modules_to_save") && !j["modules_to_save"].is_null()) {
      l.modules_to_save = j["modules_to_save"].get<std::vector<std::string>>();
    }
    return l;
  } catch (const json::exception& e) {
    throw UserError("import-hf --adapter: " + path + ": " + e.what());
  }
}

}  // namespace moe::hf
