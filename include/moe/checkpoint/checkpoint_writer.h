// Writes the run's checkpoints (atomically, with retention; see checkpoint_dirs.h) from the
// live model, optimizer, loss scaler and training state, and applies checkpoint.on_failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "moe/checkpoint/checkpoint_dirs.h"
#include "moe/checkpoint/checkpoint_files.h"
#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/optim/adamw.h"
#include "moe/optim/loss_scaler.h"

namespace spdlog {
class logger;
}

namespace moe::checkpoint {

class Checkpointer {
 public:
  Checkpointer(const config::Config& cfg, CheckpointStore& store, model::TransformerLM& model,
               optim::FusedAdamW& optimizer, optim::LossScaler& scaler, TrainingState& state,
               spdlog::logger& log, const std::string& resumed_dir = "");
  // A checkpoint of the current state (state.step); `why` is logged. A failed write removes its
  // partial directory and rethrows, or with on_failure = continue logs and returns.
  // `optimizer` (optional) replaces the session's optimizer state (ZeRO: every owner's state,
  // gathered one tensor at a time); it is drained even when the write fails.
  void save(const char* why, int64_t metrics_lines, const OptimizerStream* optimizer = nullptr);
  // Since the last successful checkpoint, or since this object was made.
  double minutes_since_save() const;
  // Called with each committed checkpoint's directory and step (checkpoint.remote's upload).
  void after_commit(std::function<void(const std::string& dir, int64_t step)> fn) {
    after_commit_ = std::move(fn);
  }

 private:
  const config::Config& cfg_;
  CheckpointStore& store_;
  model::TransformerLM& model_;
  optim::FusedAdamW& optimizer_;
  optim::LossScaler& scaler_;
  TrainingState& state_;
  spdlog::logger& log_;
  std::chrono::steady_clock::time_point last_save_;
  // A model descending from an import: where its HF config and tokenizer files are copied from
  // into each checkpoint (hf_files.h); "" for a model trained from scratch.
  std::string hf_source_;
  std::function<void(const std::string&, int64_t)> after_commit_;
};

}  // namespace moe::checkpoint
