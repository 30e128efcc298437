// The training device and moving batches to it: shared by training, `eval` and `generate`.
#pragma once

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/data/streaming_loader.h"

namespace moe::train {

// The device from training.device, with the MoE kernel path checked against it and this build
// (UserError naming the config file and key), before any caller writes anything.
torch::Device pick_device(const config::Config& cfg);

// Batch buffers as torch tensors: pinned when training on CUDA (non-blocking copies).
data::BufferFactory tensor_buffers(const torch::Device& device);
torch::Tensor to_device(const data::Batch& b, const torch::Device& device);

}  // namespace moe::train
