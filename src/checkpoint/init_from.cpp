#include "moe/checkpoint/init_from.h"

#include <filesystem>

#include <torch/torch.h>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/checkpoint/resume_policy.h"
#include "moe/config/architecture.h"
#include "moe/hf/load_hf_weights.h"
#include "moe/util/errors.h"

namespace moe::checkpoint {

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

void load_lora_base(const config::Config& cfg, model::TransformerLM& model, bool seeded) {
  if (!cfg.model.init_from.empty()) {
    init_weights_from(cfg, model);
  } else if (!seeded) {
    torch::manual_seed(cfg.training.seed);  // the initialisation a fresh run would draw
    model::TransformerLM fresh(cfg, torch::Device(torch::kCPU));
    auto mine = model->named_parameters();
    torch::NoGradGuard no_grad;
    for (const auto& item : fresh->named_parameters()) {
      if (!config::is_lora_parameter(item.key())) mine[item.key()].copy_(item.value());
    }
  }
  model->set_base(layers::base_fingerprint(*model, model->base_dtype(), model->quantized_weights()),
                  cfg.model.init_from);
}

}  // namespace moe::checkpoint
