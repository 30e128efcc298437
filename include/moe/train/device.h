// The training device and moving batches to it: shared by training, `eval` and `generate`.
#pragma once

#include <string>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/data/streaming_loader.h"

namespace moe::train {

// The device from training.device, with the MoE kernel path checked against it and this build
// (UserError naming the config file and key), before any caller writes anything.
torch::Device pick_device(const config::Config& cfg);

// training.cpu_affinity, before the run starts its threads: every thread of the process pinned
// to the CPU list, or with "auto" to the CPUs near GPU `local_rank` (a CPU run, or a GPU whose
// sysfs entry does not say, leaves placement to the OS and says so). Returns the CPUs pinned to
// ("" when none).
std::string apply_cpu_affinity(const config::Config& cfg, int64_t local_rank);

// Batch buffers as torch tensors: pinned when training on CUDA (non-blocking copies).
data::BufferFactory tensor_buffers(const torch::Device& device);
torch::Tensor to_device(const data::Batch& b, const torch::Device& device);

}  // namespace moe::train
