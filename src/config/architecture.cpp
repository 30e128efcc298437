#include "moe/config/architecture.h"

#include <set>

#include "moe/util/errors.h"

namespace moe::config {

using nlohmann::json;

bool is_training_setting(const std::string& key, const json& sections) {
  static const std::set<std::string> kFree = {"model.dropout",
                                              "model.init_std",
                                              "model.init_from",
                                              "model.attention_backend",
                                              "moe.aux_loss_coeff",
                                              "moe.z_loss_coeff",
                                              "moe.expert_dropout",
                                              "moe.capacity_factor",
                                              "moe.kernels",
                                              "moe.dispatch_dtype",
                                              "moe.fused_gate_up",
                                              "moe.router_bias_update_rate",
                                              "moe.expert_parallel_size",
                                              "moe.offload_experts",
                                              "moe.offload_ring_layers",
                                              "model.rope_scaling"};
  if (kFree.count(key) != 0) return true;
  // With rotary positions, or none, the window length is no weight's shape: any seq_len
  // evaluates.
  if (key == "model.seq_len") {
    const json& m = sections.contains("model") ? sections["model"] : json::object();
    return m.value("rope_theta", 0.0) > 0 || m.value("no_position_encoding", false);
  }
  return false;
}

void check_same_architecture(const Config& cfg, const json& sections, const std::string& source) {
  const json mine = to_json(cfg);
  for (const char* section : {"model", "moe"}) {
    if (!sections.contains(section)) continue;
    for (const auto& [key, value] : sections[section].items()) {
      const std::string path = std::string(section) + "." + key;
      if (is_training_setting(path, sections) || !mine[section].contains(key) ||
          mine[section][key] == value) {
        continue;
      }
      throw UserError("config: " + cfg.source_file + ": " + path + " = " +
                      mine[section][key].dump() + " contradicts " + source + " (" + value.dump() +
                      "); the architecture comes from the weights");
    }
  }
}

void fill_architecture(json& root, const json& sections) {
  for (const char* section : {"model", "moe"}) {
    if (!sections.contains(section)) continue;
    if (!root.contains(section) || root[section].is_null()) root[section] = json::object();
    if (!root[section].is_object()) continue;  // from_json names the type error
    for (const auto& [key, value] : sections[section].items()) {
      const std::string path = std::string(section) + "." + key;
      // Training settings (dropout, kernels, ...) stay the config's own; the window length, its
      // rotary scaling and the router's loss coefficients (the model's own: HF's
      // router_aux_loss_coef) are taken like the architecture when the config leaves them out,
      // so that chained fine-tunes and their exports keep what the imported model said.
      const bool inherited = path == "model.seq_len" || path == "model.rope_scaling" ||
                             path == "moe.aux_loss_coeff" || path == "moe.z_loss_coeff";
      const bool setting = !inherited && is_training_setting(path, sections);
      if (setting || root[section].contains(key)) continue;
      root[section][key] = value;
    }
  }
}

void fill_adapters(json& root, const json& saved) {
  if (!saved.contains("lora") || !saved["lora"].is_object()) return;
  const json& r = saved["lora"].contains("r") ? saved["lora"]["r"] : json();
  if (!r.is_number() || r.get<double>() <= 0) return;
  if (!root.contains("lora") || root["lora"].is_null()) root["lora"] = saved["lora"];
  // A 4-bit base is part of what the adapters were trained over: it comes with them too.
  const bool own = root.contains("quantization") && !root["quantization"].is_null();
  if (!own && saved.contains("quantization") && saved["quantization"].is_object()) {
    root["quantization"] = saved["quantization"];
  }
}

namespace {
std::string diff_at(const json& a, const json& b, const std::string& path) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string p = path.empty() ? key : path + "." + key;
      if (!b.contains(key)) return p + " = " + value.dump() + " vs (absent)";
      const std::string d = diff_at(value, b[key], p);
      if (!d.empty()) return d;
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key))
        return (path.empty() ? key : path + "." + key) + " = (absent) vs " + value.dump();
    }
    return "";
  }
  return a == b ? "" : path + " = " + a.dump() + " vs " + b.dump();
}
}  // namespace

std::string first_difference(const json& a, const json& b) { return diff_at(a, b, ""); }

}  // namespace moe::config
