// A LoRA model's adapters <-> PEFT's on-disk adapter (adapter_config.json +
// adapter_model.safetensors), as peft.PeftModel.from_pretrained loads it onto the transformers
// model of the same family (transformers >= 5, PEFT >= 0.17: experts as stacked parameters).
// Layouts: docs/hf.md "LoRA adapters".
#pragma once

#include <string>

#include "moe/config/config.h"
#include "moe/hf/hf_config.h"
#include "moe/hf/peft_adapter_config.h"  // lora_config_from_peft
#include "moe/model/transformer.h"

namespace moe::hf {

// Writes the adapter of `model` (lora.r > 0) into `dir` (which exists). `base`: the base model
// directory recorded as base_model_name_or_path ("" = none). UserError naming what PEFT cannot
// express (the dense layers' adapters, dropout on the experts' adapters). Returns the number
// of tensors written.
int64_t write_peft_adapter(model::TransformerLM& model, const config::Config& cfg,
                           const families::ModelFamily& family, const std::string& dir,
                           const std::string& base);

// Reads a PEFT adapter directory onto `model` (whose config's lora section matches the
// adapter's r, alpha and targets, see lora_config_from_peft): every tensor checked before any is
// copied.
void read_peft_adapter(const std::string& dir, model::TransformerLM& model,
                       const config::Config& cfg, const families::ModelFamily& family);

}  // namespace moe::hf
