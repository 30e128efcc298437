// Writes the run's checkpoints (atomically, with retention; see checkpoint_store.h) from the
// live model, optimizer, loss scaler and training state, and applies checkpoint.on_failure.
#pragma once

#include <chrono>
#include <cstdint>

#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/train/adamw.h"
#include "moe/train/checkpoint.h"
#include "moe/train/checkpoint_store.h"
#include "moe/train/loss_scaler.h"

namespace spdlog {
class logger;
}

namespace moe::train {

class Checkpointer {
 public:
  Checkpointer(const config::Config& cfg, CheckpointStore& store, model::TransformerLM& model,
               FusedAdamW& optimizer, LossScaler& scaler, TrainingState& state,
               spdlog::logger& log);
  // A checkpoint of the current state (state.step); `why` is logged. A failed write removes its
  // partial directory and rethrows, or with on_failure = continue logs and returns.
  // `optimizer` (optional) replaces the session's one (ZeRO: the state gathered from every rank).
  void save(const char* why, int64_t metrics_lines, FusedAdamW* optimizer = nullptr);
  // Since the last successful checkpoint, or since this object was made.
  double minutes_since_save() const;

 private:
  const config::Config& cfg_;
  CheckpointStore& store_;
  model::TransformerLM& model_;
  FusedAdamW& optimizer_;
  LossScaler& scaler_;
  TrainingState& state_;
  spdlog::logger& log_;
  std::chrono::steady_clock::time_point last_save_;
};

}  // namespace moe::train
