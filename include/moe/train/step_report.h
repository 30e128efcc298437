// Everything the trainer reports once per optimizer step, behind one call: the metrics record
// (handed to `write`: the JSON-lines file and the sinks of monitor.h), GPU memory and NVML
// samples, the log line every steps_per_print steps, the TTY progress bar, and systemd's
// watchdog and status line. Validation results go the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/train/eval_result.h"

namespace spdlog {
class logger;
}

namespace moe::train {

// The figures of one optimizer step, as the trainer measured them.
struct StepFigures {
  int64_t step = 0;  // 1-based, just completed
  bool skipped = false, graphed = false;
  double loss = 0, aux_loss = 0, z_loss = 0, lr = 0;
  std::optional<double> grad_norm;  // none after an fp16 overflow
  int64_t tokens = 0, dropped = 0, epoch = 0;
  int64_t target_tokens = 0;  // positions that took the loss (SFT data: the answers' tokens)
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer [E]
  std::vector<int64_t> source_passes;  // data.blend: the pass each source is in (1 = first)
  double data_wait_s = 0, step_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
  std::optional<double> loss_scale;  // fp16 runs
  int64_t skipped_steps = 0;         // fp16: overflow steps so far
};

class StepReporter {
 public:
  using Writer = std::function<void(const nlohmann::json&)>;
  StepReporter(const config::Config& cfg, const torch::Device& device, int64_t total_steps,
               int64_t first_step, Writer write, spdlog::logger& log);
  ~StepReporter();
  void step(const StepFigures& f);
  // Rates, the tokens/s of the log line and the ETA count from here (the first step).
  void start_clock() { start_ = std::chrono::steady_clock::now(); }
  // A validation record; step 0 is the one before training.
  void eval(int64_t step, const train::EvalResult& r);

 private:
  class Nvml;
  void progress(int64_t done, double loss);
  void clear_progress();

  const config::Config& cfg_;
  torch::Device device_;
  int64_t total_steps_, first_step_;
  Writer write_;
  spdlog::logger& log_;
  std::unique_ptr<Nvml> nvml_;
  bool progress_bar_;
  double flops_per_token_, causal_flops_per_token_;
  int64_t world_size_;
  double peak_flops_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace moe::train
