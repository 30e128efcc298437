#include "moe/train/inference.h"

#include "moe/train/run_inputs.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/checkpoint/checkpoint_dirs.h"
#include "moe/checkpoint/checkpoint_files.h"
#include "moe/checkpoint/resume_policy.h"
#include "moe/config/architecture.h"
#include "moe/data/dataset.h"
#include "moe/data/token_shard.h"
#include "moe/train/evaluation.h"
#include "moe/train/run_config.h"
#include "moe/util/errors.h"
#include "moe/util/safetensors.h"

namespace moe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string newest_checkpoint(const std::string& output_dir) {
  auto c =
      checkpoint::CheckpointStore((fs::path(output_dir) / "checkpoints").string()).candidates();
  if (c.empty()) throw UserError("checkpoint: no checkpoint in " + output_dir + "/checkpoints");
  return c.front();
}
// Writes the evaluated windows and logits as safetensors: "tokens" [N, S + 1] I64 (the token
// ids), "loss_mask" [N, S + 1] U8 (1 where the token is a training target: 0 for the prompt
// tokens of SFT data), "logits" [N, S, V] F32 (N windows in evaluation order). The loader's
// in-band not-a-target flag (data::kNotTargetBit) stays out of the user's file.
void write_dump(const std::string& path, const EvalDump& d) {
  const auto windows = torch::cat(d.windows, 0);
  const auto tokens = windows.bitwise_and(data::kTokenIdBits).contiguous();
  const auto mask = windows.bitwise_and(data::kNotTargetBit).eq(0).to(torch::kUInt8).contiguous();
  const auto logits = torch::cat(d.logits, 0).contiguous();
  write_safetensors(
      path,
      {{"tokens", "I64", tokens.sizes().vec(), tokens.data_ptr(),
        static_cast<size_t>(tokens.nbytes())},
       {"loss_mask", "U8", mask.sizes().vec(), mask.data_ptr(), static_cast<size_t>(mask.nbytes())},
       {"logits", "F32", logits.sizes().vec(), logits.data_ptr(),
        static_cast<size_t>(logits.nbytes())}},
      {{"format", "pt"}, {"producer", "moe-train eval"}});
}
}  // namespace

json eval_checkpoint(const EvalRequest& req) {
  std::string dir = req.checkpoint;
  if (dir.empty())
    dir = newest_checkpoint(load_run_config(req.config_path, req.overrides).training.output_dir);
  // The architecture comes from the checkpoint: keys the config leaves out are taken from it, and
  // a --config/--set value that contradicts it is refused, naming the key.
  const json saved = checkpoint::read_checkpoint_state(dir).config;
  json root = config::load_json_file(req.config_path);
  for (const auto& o : req.overrides) config::apply_override(root, o);
  config::fill_architecture(root, saved);
  config::fill_adapters(root, saved);
  fill_eod_from_manifest(root);  // as training read the dataset
  config::Config cfg = config::from_json(root, req.config_path);
  config::validate(cfg);
  config::check_same_architecture(cfg, saved, "the checkpoint " + dir);
  const data::DatasetShards shards = open_training_data(cfg);
  if (shards.valid.empty()) throw UserError("eval: the config names no validation data");
  const torch::Device device = pick_device(cfg);
  model::TransformerLM model(cfg, device);
  checkpoint::TrainingState st = checkpoint::load_checkpoint(dir, model, nullptr);
  model->to(device);
  EvalDump dump;
  if (!req.dump_logits.empty() && !shards.sources.empty())
    throw UserError("eval --dump-logits: not for a data.blend config (name one dataset)");
  EvalResult r =
      evaluate_dataset(model, shards, cfg, device, req.dump_logits.empty() ? nullptr : &dump);
  if (!req.dump_logits.empty()) write_dump(req.dump_logits, dump);
  json out = {{"checkpoint", dir},
              {"step", st.step},
              {"loss", r.loss},
              {"perplexity", r.perplexity},
              {"accuracy", r.accuracy},
              {"tokens", r.tokens},
              {"majority_baseline", data::majority_baseline(shards.valid, cfg.model.seq_len)},
              {"expert_imbalance", r.expert_imbalance}};
  for (const auto& src : r.sources) {
    out["sources"][src.name] = {{"loss", src.loss},
                                {"accuracy", src.accuracy},
                                {"perplexity", src.perplexity},
                                {"tokens", src.tokens}};
  }
  return out;
}

json describe_checkpoint(const std::string& dir) {
  json out;
  for (const char* name : {"model", "optimizer"}) {
    const fs::path path = fs::path(dir) / (std::string(name) + ".safetensors");
    // Weights-only checkpoints (import-hf) have no optimizer file.
    if (std::string(name) == "optimizer" && !fs::exists(path) &&
        fs::exists(fs::path(dir) / "model.safetensors")) {
      continue;
    }
    SafetensorsFile f(path.string());
    json tensors = json::object();
    for (const auto& [tname, e] : f.entries())
      tensors[tname] = {{"dtype", e.dtype}, {"shape", e.shape}};
    out[name] = tensors;
  }
  return out;
}

}  // namespace moe::train
