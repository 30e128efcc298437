// Everything about a training run that can reject the user's input, checked before anything is
// written: the device (and the kernel path on it), data paths and shards, the output directory,
// and the run's length.
#pragma once

#include <cstdint>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/data/dataset.h"
#include "moe/train/trainer.h"

namespace spdlog {
class logger;
}

namespace moe::train {

struct RunInputs {
  torch::Device device{torch::kCPU};
  bool fp16 = false, bf16 = false;  // autocast on a CUDA device (fp32 on the CPU)
  data::DatasetShards shards;
  bool has_valid = false;
  int64_t train_windows = 0;  // seq_len + 1 token windows in the training shards
  int64_t total_steps = 0;    // training.train_iters, else epochs x steps per epoch
};

// The shards the config names (data.path, data.train_path / valid_path, or data.blend), opened
// and checked; throws UserError naming the file.
data::DatasetShards open_training_data(const config::Config& cfg);

// Throws UserError naming the file and key for anything wrong; writes nothing.
RunInputs check_run_inputs(const config::Config& cfg, const TrainOptions& opt, spdlog::logger& log);

}  // namespace moe::train
