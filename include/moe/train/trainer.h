// The training run: data -> model -> AdamW with clipping and the LR schedule -> periodic
// validation -> metrics. Everything that can be wrong with the user's input is checked before
// anything is written to the output directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/checkpoint/resume_policy.h"
#include "moe/config/config.h"
#include "moe/parallel/launch_env.h"
#include "moe/train/eval_result.h"

namespace moe::train {

struct TrainSummary {
  int64_t steps = 0;
  int64_t resumed_from = -1;  // step of the checkpoint resumed from, -1 for a fresh start
  bool interrupted = false;   // stopped by SIGTERM/SIGINT after writing a checkpoint
  double first_train_loss = 0.0;
  double last_train_loss = 0.0;
  bool has_validation = false;
  EvalResult initial_eval;  // before the first step
  EvalResult final_eval;
  double majority_baseline = 0.0;  // accuracy of always predicting the most frequent token
  std::string output_dir;
  // Optimizer offload: host bytes of master weights, gradient staging and moments at the end
  // (optim::FusedAdamW::host_bytes); 0 without offload.
  int64_t offload_host_bytes = 0;
};

// The command line's run options: what to do with earlier runs' files (checkpoint::ResumeRequest)
// and where the launcher put this process.
struct TrainOptions : checkpoint::ResumeRequest {
  parallel::LaunchEnv launch;  // rank and world size from torchrun / Slurm (world size 1: alone)
};

TrainSummary run_training(const config::Config& cfg, const TrainOptions& opt);

}  // namespace moe::train
