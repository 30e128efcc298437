// Hugging Face model directories read into our parameters: config.json -> a config, and the
// safetensors weights, every tensor checked against our parameter layout (one table,
// hf_tensor_map.h), copied into a model or streamed into model.safetensors. Below the
// checkpoint code (model.init_from and LoRA bases read HF weights through here); import-hf and
// export-hf (convert/hf_checkpoint.h) sit above both.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/hf/hf_config.h"
#include "moe/hf/hf_files.h"
#include "moe/model/transformer.h"

namespace moe::hf {

// Checks hf_dir's config.json against cfg's architecture, then copies its weights into `model`.
void load_hf_weights(const std::string& hf_dir, const config::Config& cfg,
                     model::TransformerLM& model);

// An HF directory's config.json, read and mapped: the family, our model/moe sections, what is
// not imported (warnings), and the validated config those sections make.
struct HfModel {
  nlohmann::json hf_config;
  const families::ModelFamily* family = nullptr;
  nlohmann::json sections;  // {"model", "moe"}
  std::vector<std::string> warnings;
  config::Config cfg;
};
HfModel read_hf_model(const std::string& dir);

// Our parameters by name, and the routers' selection biases (buffers: GLM-4.5's
// e_score_correction_bias is one).
std::map<std::string, torch::Tensor> parameter_map(model::TransformerLM& model);

// Checks every tensor of `w`, then copies them into the model as fp32 training weights.
void copy_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                     const families::ModelFamily& family, model::TransformerLM& model);

// What stream_hf_weights read besides the weights.
struct StreamedHf {
  // The routers' selection biases by our buffer name, for state.json's "expert_biases".
  nlohmann::json expert_biases = nlohmann::json::object();
  int64_t skipped_mtp_tensors = 0;  // multi-token-prediction layers' tensors, not imported
};

// import-hf without building the model: each parameter assembled from its HF tensors and
// appended to `out_file` (model.safetensors), then freed.
StreamedHf stream_hf_weights(const HfWeights& w, const std::string& dir, const config::Config& cfg,
                             const families::ModelFamily& family, const std::string& out_file);

}  // namespace moe::hf
