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
  const train::StateFile state = train::read_state_file(dir);
  if (state.status == train::StateFile::Status::kMissing)
    throw UserError("generate: " + dir + ": no state.json (not a checkpoint or HF model dir)");
  if (state.status != train::StateFile::Status::kOk || !state.json.contains("config"))
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

GenerationSession::GenerationSession(const std::string& dir, const std::string& device,
                                     const std::string& chat_template)
    : dir_(dir) {
  if (!fs::is_directory(dir))
    throw UserError("generate: --checkpoint " + dir + ": no such directory");
  if (!train::hf_side_source(dir).empty() && !fs::exists(fs::path(dir) / "state.json")) {
    imported_ =
        (fs::temp_directory_path() / ("moe-train-generate-" + std::to_string(::getpid()))).string();
    hf::import_hf(dir, imported_);
    dir_ = imported_;
  }
  cfg = generation_config(dir_, device);
  tokenizer = checkpoint_tokenizer(dir_, cfg.model.vocab_size);
  chat::ChatSetup setup = checkpoint_chat(dir_, chat_template);  // ChatTemplate: move-only
  chat.variables = std::move(setup.variables);
  if (setup.chat_template) chat.chat_template.emplace(std::move(*setup.chat_template));
  defaults = read_generation_defaults(dir_, *tokenizer, cfg.model.seq_len);
  const torch::Device dev = train::pick_device(cfg);
  model = model::TransformerLM(cfg, dev);
  train::load_checkpoint(dir_, model, nullptr);
  model->to(dev);
  model->eval();
}

GenerationSession::~GenerationSession() {
  if (imported_.empty()) return;
  std::error_code ec;
  remove_tree(imported_, ec);
}

}  // namespace moe::generate
