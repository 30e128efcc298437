// Pieces shared by training, `moe-train eval` and `moe-train generate` (the device and batch
// helpers are in device.h): validation (loss, perplexity, next-token accuracy, expert load),
// sampling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/data/dataset.h"
#include "moe/data/streaming_loader.h"
#include "moe/model/transformer.h"
#include "moe/train/device.h"
#include "moe/train/eval_result.h"

namespace moe::train {

// The windows an evaluation saw and the model's logits on them (eval --dump-logits).
struct EvalDump {
  std::vector<torch::Tensor> windows;  // [B, S + 1] int64 each: inputs and next-token targets
  std::vector<torch::Tensor> logits;   // [B, S, V] fp32 each, on the CPU
};

// Validation over the first eval_iters micro-batches of `shards`, in order; `dump` (optional)
// keeps the windows and logits.
EvalResult evaluate(model::TransformerLM& model, const std::vector<data::ShardInfo>& shards,
                    const config::Config& cfg, const torch::Device& device,
                    EvalDump* dump = nullptr);

// Validation of a dataset: evaluate() over its validation shards; for a blend (data.blend), each
// source with validation data on its own (EvalResult::sources) and, as the overall figures, the
// blend's weighted mean over them (weights renormalised over those sources): the loss of the
// training mixture, which one pass over the concatenated shards would not be (with eval_iters it
// would see only the first source). `dump` applies to a single dataset only.
EvalResult evaluate_dataset(model::TransformerLM& model, const data::DatasetShards& shards,
                            const config::Config& cfg, const torch::Device& device,
                            EvalDump* dump = nullptr);

}  // namespace moe::train
