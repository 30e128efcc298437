// One optimizer step's compute: forward and backward over the micro-batches, gradient clipping,
// the non-finite policy, and the update. Two runners share one contract (and the accumulation and
// clipping code): the eager one, and the CUDA-graph one, which runs eager warm-up steps, captures
// once and replays (falling back to eager when the capture fails).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/optim/adamw.h"
#include "moe/optim/gradient_clipping.h"
#include "moe/optim/loss_scaler.h"
#include "moe/parallel/step_result.h"
#include "moe/train/cuda_graph_step.h"

namespace spdlog {
class logger;
}

namespace moe::parallel {
class DataParallel;
}

namespace moe::train {
// The data-parallel boundary and a step's result are the parallel room's (moe::parallel).
using parallel::DataParallel;
using parallel::StepResult;

// Forward of one micro-batch [B, S + 1]: next-token cross entropy over the positions that take a
// loss (loss_targets.h), plus the weighted router losses.
MicroLosses compute_losses(model::TransformerLM& model, const torch::Tensor& batch,
                           const config::Config& cfg);

// The next micro-batch [B, S + 1] on the training device.
using NextBatch = std::function<torch::Tensor()>;

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Forward and backward of every micro-batch of optimizer step `step` (0-based), then clipping.
  virtual StepResult run(int64_t step, double lr, const NextBatch& next) = 0;
  // Applies the update of the step run() computed (a no-op where the graph already did).
  virtual void update(double lr) = 0;
};

struct StepRunnerOptions {
  int64_t micro_batches = 1;
  double max_norm = 0;  // gradient_clipping; infinity = no clipping
  bool bf16 = false, fp16 = false;
  bool sync_for_timing = false;  // wall_clock_breakdown on CUDA: sync between phases
  // The data-parallel boundary (data_parallel.h): a world of one or a group of ranks; the
  // runner calls it the same way for both. Required.
  DataParallel* dp = nullptr;
};

// The eager runner, or (training.cuda_graph and an eligible run) the CUDA-graph runner.
std::unique_ptr<StepRunner> make_step_runner(model::TransformerLM& model, const config::Config& cfg,
                                             optim::FusedAdamW& optimizer,
                                             optim::LossScaler& scaler,
                                             const StepRunnerOptions& opt,
                                             const torch::Device& device, int64_t first_step,
                                             spdlog::logger& log);

// The policy for non-finite steps (bf16/fp32; fp16 overflow is the loss scaler's): skip the
// update, and after training.max_bad_steps in a row stop with a TrainingError naming the step,
// the first parameter with non-finite gradients and the last good checkpoint.
class NonFiniteGuard {
 public:
  NonFiniteGuard(int64_t max_bad_steps, spdlog::logger& log) : max_(max_bad_steps), log_(log) {}
  // True when the step must be skipped. `checkpoints`: lists them, best first, for the message.
  bool skip(const StepResult& r, double loss, int64_t step, model::TransformerLM& model,
            const std::function<std::vector<std::string>()>& checkpoints);

 private:
  int64_t max_;
  int64_t consecutive_ = 0;
  spdlog::logger& log_;
};

// Shared by both runners. The gradients of `params` that exist.
std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params);
// acc[i] += add[i] per MoE layer (acc empty: a copy of add).
void accumulate_loads(std::vector<torch::Tensor>& acc, const std::vector<torch::Tensor>& add);

}  // namespace moe::train
