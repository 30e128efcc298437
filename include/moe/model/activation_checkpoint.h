// Activation checkpointing of one transformer block (the seed guide's OOM remedy): the forward
// keeps only the block's input; the backward re-runs the block with the same RNG state (so
// dropout masks repeat) and backpropagates through the recomputed graph. Same losses and
// gradients as without (tests/model/activation_checkpoint_test.cpp), less activation memory.
#pragma once

#include "moe/model/transformer.h"

namespace moe::model {

BlockOutput checkpointed_block_forward(Block& block, const torch::Tensor& x);

// Blocks recomputed in backward passes so far (lets tests see that checkpointing happened).
int64_t checkpoint_recomputations();

}  // namespace moe::model
