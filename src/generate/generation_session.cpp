#include "moe/generate/generation_session.h"

#include <unistd.h>
#include <filesystem>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/checkpoint/resume_policy.h"
#include "moe/checkpoint/side_files.h"
#include "moe/convert/hf_checkpoint.h"
#include "moe/train/device.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::generate {

namespace fs = std::filesystem;

namespace {

// The checkpoint's config with what generation needs: no data, the device asked for, and no
// capacity limit on the experts (every token reaches its chosen experts, as transformers).
config::Config generation_config(const std::string& dir, const std::string& device) {
  const checkpoint::StateFile state = checkpoint::read_state_file(dir);
  if (state.status == checkpoint::StateFile::Status::kMissing)
    throw UserError("generate: " + dir + ": no state.json (not a checkpoint or HF model dir)");
  if (state.status != checkpoint::StateFile::Status::kOk || !state.json.contains("config"))
    throw UserError("generate: " + dir + "/state.json: damaged");
  config::Config cfg = config::from_json(state.json["config"], dir + "/state.json");
  if (cfg.data.path.empty() && cfg.data.train_path.empty() && cfg.data.blend.empty())
    cfg.data.path = "-";
  cfg.training.device =
      config::parse_choice<config::TrainingDevice>(device, "training.device", cfg.source_file);
  cfg.moe.capacity_factor = 0;
  config::validate(cfg);
  return cfg;
}

}  // namespace

GenerationSession::GenerationSession(const DecodingFlags& flags, bool need_tokenizer)
    : flags_(flags), dir_(flags.checkpoint) {
  const std::string& dir = flags.checkpoint;
  if (!fs::is_directory(dir))
    throw UserError("generate: --checkpoint " + dir + ": no such directory");
  if (!checkpoint::hf_side_source(dir).empty() && !fs::exists(fs::path(dir) / "state.json")) {
    imported_ =
        (fs::temp_directory_path() / ("moe-train-generate-" + std::to_string(::getpid()))).string();
    convert::import_hf(dir, imported_);
    dir_ = imported_;
  }
  cfg = generation_config(dir_, flags.device);
  try {
    tokenizer = checkpoint_tokenizer(dir_, cfg.model.vocab_size);
  } catch (const UserError&) {
    if (need_tokenizer) throw;
  }
  chat::ChatSetup setup = checkpoint_chat(dir_, flags.chat_template);  // ChatTemplate: move-only
  chat.variables = std::move(setup.variables);
  if (setup.chat_template) chat.chat_template.emplace(std::move(*setup.chat_template));
  defaults = read_generation_defaults(dir_, tokenizer.get(), cfg.model.seq_len);
  const torch::Device dev = train::pick_device(cfg);
  model = model::TransformerLM(cfg, dev);
  checkpoint::load_checkpoint(dir_, model, nullptr);
  model->to(dev);
  model->eval();
}

SamplingParams GenerationSession::sampling() const {
  SamplingParams p = defaults.sampling;
  const DecodingFlags& f = flags_;
  if (f.do_sample) p.do_sample = *f.do_sample;
  if (f.temperature) p.temperature = *f.temperature;
  if (f.top_k) p.top_k = *f.top_k;
  if (f.top_p) p.top_p = *f.top_p;
  if (f.min_p) p.min_p = *f.min_p;
  if (f.repetition_penalty) p.repetition_penalty = *f.repetition_penalty;
  if (f.temperature && *f.temperature == 0) p.do_sample = false;  // 0 = greedy
  p.seed = f.seed;
  return p;
}

GenerationLimits GenerationSession::limits(std::optional<int64_t> max_new_tokens) const {
  GenerationLimits l;
  l.max_new_tokens = max_new_tokens.value_or(
      flags_.max_new_tokens.value_or(defaults.max_new_tokens.value_or(256)));
  // Past max_position_embeddings a rotary model goes on as transformers' generate does (it
  // warns); learned positions end there.
  l.context = model->pos_embed ? cfg.model.seq_len : 0;
  l.eos_ids = defaults.eos_ids;
  l.min_new_tokens = flags_.min_new_tokens.value_or(defaults.min_new_tokens.value_or(0));
  l.pad_id = defaults.pad_id.value_or(l.eos_ids.empty() ? 0 : l.eos_ids[0]);
  return l;
}

GenerationSession::~GenerationSession() {
  if (imported_.empty()) return;
  std::error_code ec;
  remove_tree(imported_, ec);
}

}  // namespace moe::generate
