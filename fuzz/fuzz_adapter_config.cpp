// libFuzzer target: arbitrary bytes as a downloaded PEFT adapter's adapter_config.json, read as
// `import-hf --adapter` reads it (lora_config_from_peft), then put into a run config and
// validated as the import does. What we cannot represent is a UserError naming the file and
// key; anything else (crash, sanitizer report, other exception) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/hf/peft_adapter_config.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/moe-fuzz-adapter-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::FILE* f = std::fopen((dir + "/adapter_config.json").c_str(), "wb");
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const moe::config::LoraConfig lora = moe::hf::lora_config_from_peft(dir);
    if (lora.r < 1) __builtin_trap();  // a rank below 1 must have been refused
    const nlohmann::json root = {{"data", {{"path", "-"}}}, {"train_micro_batch_size_per_gpu", 1}};
    moe::config::Config cfg = moe::config::from_json(root, "adapter_config.json");
    cfg.lora = lora;
    moe::config::validate(cfg);
  } catch (const moe::UserError&) {
  }
  return 0;
}
