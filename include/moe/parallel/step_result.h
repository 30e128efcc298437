// What one optimizer step measured. The step runner fills it per micro-batch; the data-parallel
// boundary (data_parallel.h) completes it over the ranks (losses averaged, loads and drops
// summed), which is why it sits here, below both.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace moe::parallel {

struct StepResult {
  double lm_sum = 0, aux_sum = 0, z_sum = 0;  // summed over the micro-batches
  double grad_norm = 0;       // global L2 norm before clipping; NaN after an fp16 overflow
  bool overflow = false;      // fp16: the scaled gradients overflowed (the update is skipped)
  bool graphed = false;       // replayed from the CUDA graph (clipping and update done inside)
  int64_t dropped = 0;        // assignments dropped by expert capacity
  int64_t target_tokens = 0;  // positions that took the loss (SFT data: the answers' tokens)
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer [E], summed over micro-batches
  double forward_s = 0, backward_s = 0;          // wall_clock_breakdown (synced) or coarse
};

}  // namespace moe::parallel
