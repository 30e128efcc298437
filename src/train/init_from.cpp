#include "moe/train/init_from.h"

#include <filesystem>

#include "moe/config/architecture.h"
#include "moe/hf/load_hf_weights.h"
#include "moe/train/checkpoint.h"
#include "moe/train/resume_policy.h"
#include "moe/util/errors.h"

namespace moe::train {

namespace fs = std::filesystem;

std::string init_weights_from(const config::Config& cfg, model::TransformerLM& model) {
  const std::string& dir = cfg.model.init_from;
  if (fs::exists(fs::path(dir) / "state.json")) {
    const CheckpointState cs = read_checkpoint_state(dir);
    config::check_same_architecture(cfg, cs.config, "the checkpoint " + dir);
    load_checkpoint(dir, model, nullptr, /*restore_rng=*/false);
    return "moe-train checkpoint (step " + std::to_string(cs.step) + ")";
  }
  if (fs::exists(fs::path(dir) / "config.json")) {
    hf::load_hf_weights(dir, cfg, model);
    return "Hugging Face model";
  }
  throw UserError("config: " + cfg.source_file + ": model.init_from = \"" + dir +
                  "\": neither a moe-train checkpoint (state.json) nor a Hugging Face model "
                  "directory (config.json)");
}

}  // namespace moe::train
