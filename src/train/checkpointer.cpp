#include "moe/train/checkpointer.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "moe/util/errors.h"

namespace moe::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Checkpointer::Checkpointer(const config::Config& cfg, CheckpointStore& store,
                           model::TransformerLM& model, FusedAdamW& optimizer, LossScaler& scaler,
                           TrainingState& state, spdlog::logger& log)
    : cfg_(cfg),
      store_(store),
      model_(model),
      optimizer_(optimizer),
      scaler_(scaler),
      state_(state),
      log_(log),
      last_save_(Clock::now()) {}

void Checkpointer::save(const char* why, int64_t metrics_lines, FusedAdamW* optimizer) {
  state_.metrics_lines = metrics_lines;
  state_.config = config::to_json(cfg_);
  state_.scaler = scaler_.state();
  const std::string tmp = store_.begin(state_.step);
  try {
    save_checkpoint(tmp, model_, optimizer != nullptr ? *optimizer : optimizer_, state_);
    const std::string dir =
        store_.commit(tmp, state_.step, cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every);
    log_.info("checkpoint ({}): {}", why, dir);
  } catch (const TrainingError& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the previous checkpoint and `latest` are untouched
    if (cfg_.checkpoint.on_failure != config::OnFailure::kContinue) throw;
    log_.error("{}; training continues (checkpoint.on_failure = continue)", e.what());
    return;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  last_save_ = Clock::now();
}

double Checkpointer::minutes_since_save() const {
  return std::chrono::duration<double>(Clock::now() - last_save_).count() / 60.0;
}

}  // namespace moe::train
