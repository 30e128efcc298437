#include "moe/train/loss_targets.h"

#include <torch/nn/functional/loss.h>

#include "moe/data/token_shard.h"

namespace moe::train {

LossTargets loss_targets(const torch::Tensor& batch, const config::Config& cfg) {
  const int64_t S = batch.size(1) - 1;
  const auto ids = batch.bitwise_and(data::kTokenIdBits);
  LossTargets t;
  t.inputs = ids.narrow(1, 0, S);
  t.keep = batch.narrow(1, 1, S).reshape({-1}).lt(data::kNotTargetBit);
  if (cfg.data.reset_attention_at_eod) {
    t.keep = t.keep.logical_and(t.inputs.reshape({-1}).ne(cfg.data.eod_id));
  }
  t.targets = ids.narrow(1, 1, S).reshape({-1}).masked_fill(t.keep.logical_not(), kIgnoredTarget);
  t.count = t.keep.sum().to(torch::kFloat);
  return t;
}

torch::Tensor masked_lm_loss(const torch::Tensor& logits, const LossTargets& t) {
  // A sum over the kept positions divided by their count: the same value (and gradient) as
  // cross_entropy's mean when every position is kept, and 0 instead of NaN when none is (a
  // micro-batch that is all prompt).
  const auto sum =
      torch::nn::functional::cross_entropy(logits, t.targets,
                                           torch::nn::functional::CrossEntropyFuncOptions()
                                               .ignore_index(kIgnoredTarget)
                                               .reduction(torch::kSum));
  return sum / t.count.clamp_min(1.0);
}

}  // namespace moe::train
