// adapter_config.json, PEFT's description of a LoRA adapter, read into our lora section. A file
// from the hub (or a user's run): every key checked, a one-line UserError naming the file and the
// key otherwise. No LibTorch here, so the fuzz target (fuzz/fuzz_adapter_config.cpp) covers it.
#pragma once

#include <string>

#include "moe/config/config.h"

namespace moe::hf {

// The lora section that reproduces DIR/adapter_config.json (UserError naming the key otherwise).
config::LoraConfig lora_config_from_peft(const std::string& dir);

}  // namespace moe::hf
