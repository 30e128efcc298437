// Activation checkpointing of one transformer block (the seed guide's OOM remedy): the forward
// keeps only the block's input; the backward re-runs the block with the same RNG state (so
// dropout masks repeat) and backpropagates through the recomputed graph. Same losses and
// gradients as without (tests/model/activation_checkpoint_test.cpp), less activation memory.
#pragma once

#include "moe/model/transformer.h"

namespace moe::model {

// on_host (DeepSpeed's cpu_checkpointing): a CUDA input is kept in pinned host memory between the
// forward and the backward (copied out and back on the current stream), not on the device.
BlockOutput checkpointed_block_forward(Block& block, const torch::Tensor& x, bool on_host = false);

// Blocks recomputed in backward passes so far (lets tests see that checkpointing happened).
int64_t checkpoint_recomputations();

}  // namespace moe::model
