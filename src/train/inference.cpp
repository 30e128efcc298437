#include "moe/train/inference.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/data/dataset.h"
#include "moe/train/checkpoint.h"
#include "moe/train/checkpoint_store.h"
#include "moe/train/evaluation.h"
#include "moe/train/resume_policy.h"
#include "moe/util/errors.h"
#include "moe/util/safetensors.h"

namespace moe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string newest_checkpoint(const std::string& output_dir) {
  auto c = CheckpointStore((fs::path(output_dir) / "checkpoints").string()).candidates();
  if (c.empty()) throw UserError("checkpoint: no checkpoint in " + output_dir + "/checkpoints");
  return c.front();
}
// Keys of the model and moe sections that are training or evaluation settings, free to differ
// from the checkpoint's; every other key of these sections is architecture.
bool may_differ(const std::string& key) {
  static const std::set<std::string> kFree = {
      "model.dropout",      "model.init_std",      "moe.aux_loss_coeff", "moe.z_loss_coeff",
      "moe.expert_dropout", "moe.capacity_factor", "moe.kernels"};
  return kFree.count(key) != 0;
}

// The architecture comes from the checkpoint: a --config/--set value that contradicts the
// checkpoint's saved config is refused, naming the key (data and evaluation settings may
// differ).
void check_architecture(const config::Config& cfg, const json& saved, const std::string& dir) {
  const json mine = config::to_json(cfg);
  for (const char* section : {"model", "moe"}) {
    if (!saved.contains(section)) continue;
    for (const auto& [key, value] : saved[section].items()) {
      const std::string path = std::string(section) + "." + key;
      if (may_differ(path) || !mine[section].contains(key) || mine[section][key] == value) continue;
      throw UserError("config: " + cfg.source_file + ": " + path + " = " +
                      mine[section][key].dump() + " contradicts the checkpoint " + dir + " (" +
                      value.dump() + "); the architecture comes from the checkpoint");
    }
  }
}
}  // namespace

json eval_checkpoint(const config::Config& cfg, const std::string& checkpoint_dir) {
  const std::string dir =
      checkpoint_dir.empty() ? newest_checkpoint(cfg.training.output_dir) : checkpoint_dir;
  check_architecture(cfg, read_checkpoint_state(dir).config, dir);
  const data::DatasetShards shards =
      data::open_dataset({cfg.data.path, cfg.data.train_path, cfg.data.valid_path},
                         cfg.model.vocab_size, cfg.model.seq_len, cfg.data.verify_checksums);
  if (shards.valid.empty()) throw UserError("eval: the config names no validation data");
  const torch::Device device = pick_device(cfg);
  model::TransformerLM model(cfg, device);
  TrainingState st = load_checkpoint(dir, model, nullptr);
  model->to(device);
  EvalResult r = evaluate(model, shards.valid, cfg, device);
  return {{"checkpoint", dir},
          {"step", st.step},
          {"loss", r.loss},
          {"perplexity", r.perplexity},
          {"accuracy", r.accuracy},
          {"tokens", r.tokens},
          {"majority_baseline", data::majority_baseline(shards.valid, cfg.model.seq_len)},
          {"expert_imbalance", r.expert_imbalance}};
}

std::string generate_text(const GenerateOptions& opt) {
  const StateFile state = read_state_file(opt.checkpoint_dir);
  if (state.status == StateFile::Status::kMissing)
    throw UserError("generate: " + opt.checkpoint_dir + ": no state.json (not a checkpoint)");
  if (state.status != StateFile::Status::kOk || !state.json.contains("config")) {
    throw UserError("generate: " + opt.checkpoint_dir + "/state.json: damaged");
  }
  config::Config cfg = config::from_json(state.json["config"], opt.checkpoint_dir + "/state.json");
  cfg.training.device =
      config::parse_choice<config::TrainingDevice>(opt.device, "training.device", cfg.source_file);
  config::validate(cfg);
  std::vector<int64_t> prompt;
  for (unsigned char c : opt.prompt) {
    if (c >= cfg.model.vocab_size) {
      throw UserError("generate: prompt byte " + std::to_string(c) + " is outside the model's " +
                      std::to_string(cfg.model.vocab_size) + "-token vocabulary");
    }
    prompt.push_back(c);
  }
  if (prompt.empty()) throw UserError("generate: --prompt must not be empty");
  const torch::Device device = pick_device(cfg);
  model::TransformerLM model(cfg, device);
  load_checkpoint(opt.checkpoint_dir, model, nullptr);
  model->to(device);
  SamplingOptions s;
  s.max_new_tokens = opt.max_new_tokens;
  s.temperature = opt.temperature;
  s.top_k = opt.top_k;
  s.seed = opt.seed;
  std::string out;
  for (int64_t t : generate(model, prompt, cfg.model.seq_len, s, device)) {
    out.push_back(static_cast<char>(t < 256 ? t : '?'));  // byte-level vocabularies
  }
  return out;
}

json describe_checkpoint(const std::string& dir) {
  json out;
  for (const char* name : {"model", "optimizer"}) {
    SafetensorsFile f((fs::path(dir) / (std::string(name) + ".safetensors")).string());
    json tensors = json::object();
    for (const auto& [tname, e] : f.entries())
      tensors[tname] = {{"dtype", e.dtype}, {"shape", e.shape}};
    out[name] = tensors;
  }
  return out;
}

}  // namespace moe::train
