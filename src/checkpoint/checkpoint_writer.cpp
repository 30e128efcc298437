#include "moe/checkpoint/checkpoint_writer.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "moe/checkpoint/side_files.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::checkpoint {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Checkpointer::Checkpointer(const config::Config& cfg, CheckpointStore& store,
                           model::TransformerLM& model, optim::FusedAdamW& optimizer,
                           optim::LossScaler& scaler, TrainingState& state, spdlog::logger& log,
                           const std::string& resumed_dir)
    : cfg_(cfg),
      store_(store),
      model_(model),
      optimizer_(optimizer),
      scaler_(scaler),
      state_(state),
      log_(log),
      last_save_(Clock::now()),
      hf_source_(hf_side_source(cfg.model.init_from)) {
  // A resumed run whose init_from directory is gone still has the files in its checkpoint.
  if (hf_source_.empty()) hf_source_ = hf_side_source(resumed_dir);
}

void Checkpointer::save(const char* why, int64_t metrics_lines, const OptimizerStream* optimizer) {
  state_.metrics_lines = metrics_lines;
  state_.config = config::to_json(cfg_);
  state_.scaler = scaler_.state();
  std::string tmp;
  try {
    tmp = store_.begin(state_.step);
  } catch (...) {
    if (optimizer != nullptr) optimizer->each([](const at::Tensor&) {});  // keep ranks in step
    throw;
  }
  try {
    save_checkpoint(tmp, model_,
                    optimizer != nullptr ? *optimizer : local_optimizer_stream(optimizer_), state_);
    if (!hf_source_.empty()) {
      try {
        copy_hf_side_files(hf_source_, tmp);
      } catch (const fs::filesystem_error& e) {
        throw TrainingError("checkpoint " + tmp +
                            ": cannot copy the model's Hugging Face files from " + hf_source_ +
                            ": " + e.code().message());
      }
    }
    const std::string dir =
        store_.commit(tmp, state_.step, cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every);
    if (!hf_source_.empty()) hf_source_ = dir;  // the next one copies from here
    log_.info("checkpoint ({}): {}", why, dir);
    if (after_commit_) after_commit_(dir, state_.step);
  } catch (const TrainingError& e) {
    std::error_code ec;
    remove_tree(tmp, ec);  // the previous checkpoint and `latest` are untouched
    if (cfg_.checkpoint.on_failure != config::OnFailure::kContinue) throw;
    log_.error("{}; training continues (checkpoint.on_failure = continue)", e.what());
    return;
  } catch (...) {
    std::error_code ec;
    remove_tree(tmp, ec);
    throw;
  }
  last_save_ = Clock::now();
}

double Checkpointer::minutes_since_save() const {
  return std::chrono::duration<double>(Clock::now() - last_save_).count() / 60.0;
}

}  // namespace moe::checkpoint
