// libFuzzer target: arbitrary bytes as a downloaded model's config.json, mapped as import-hf and
// model.init_from map it (architecture_from_hf, then from_json + validate as read_hf_model does),
// and exported back to config.json (export_family, hf_config_from). What we cannot represent is
// a UserError naming the file and key; anything else (crash, sanitizer report, other exception)
// is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/hf/hf_config.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json hf = moe::config::parse_json_text(text, "config.json", "hf");
    (void)moe::hf::rope_scaling_of(hf, "config.json");
  } catch (const moe::UserError&) {
  }
  try {
    const nlohmann::json hf = moe::config::parse_json_text(text, "config.json", "hf");
    const moe::families::ModelFamily* family = nullptr;
    std::vector<std::string> warnings;
    nlohmann::json root = moe::hf::architecture_from_hf(hf, "config.json", &family, &warnings);
    root["data"] = {{"path", "-"}};
    root["train_micro_batch_size_per_gpu"] = 1;
    moe::config::Config cfg = moe::config::from_json(root, "config.json");
    moe::config::validate(cfg);
    const moe::families::ModelFamily& out = moe::hf::export_family(cfg, family->architecture());
    (void)moe::hf::hf_config_from(cfg, out, hf, "bfloat16", &warnings);
    (void)moe::hf::hf_config_from(cfg, out, nlohmann::json(), "float32", nullptr);
  } catch (const moe::UserError&) {
  }
  return 0;
}
