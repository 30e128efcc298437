// What one window batch [B, S + 1] trains on: the model's inputs and the next-token targets, with
// the positions that take no loss marked: targets that are not training targets (supervised
// fine-tuning data's prompt tokens: data::kNotTargetBit, from the shards' loss_mask) and, with
// data.reset_attention_at_eod, positions whose input is the end-of-document token (Megatron's
// eod_mask_loss). The trainer's loss and the evaluation's loss and accuracy use this one rule.
#pragma once

#include <torch/types.h>

#include "moe/config/config.h"

namespace moe::train {

inline constexpr int64_t kIgnoredTarget = -100;  // cross_entropy's ignore_index

struct LossTargets {
  torch::Tensor inputs;   // [B, S] token ids (the mask bit stripped)
  torch::Tensor targets;  // [B * S] token ids, kIgnoredTarget where no loss is taken
  torch::Tensor keep;     // [B * S] bool: the positions that take a loss
  torch::Tensor count;    // scalar float: how many do
};

LossTargets loss_targets(const torch::Tensor& batch, const config::Config& cfg);

// Mean next-token cross entropy over the kept positions (0 when none is kept), from logits
// [B * S, V] in fp32.
torch::Tensor masked_lm_loss(const torch::Tensor& logits, const LossTargets& t);

}  // namespace moe::train
