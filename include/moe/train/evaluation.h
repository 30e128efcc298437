// Pieces shared by training, `moe-train eval` and `moe-train generate`: device choice, batch
// buffers, validation (loss, perplexity, next-token accuracy, expert load), sampling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/data/streaming_loader.h"
#include "moe/model/transformer.h"
#include "moe/train/trainer.h"

namespace moe::train {

// The device from training.device, with the MoE kernel path checked against it and this build
// (UserError naming the config file and key), before any caller writes anything.
torch::Device pick_device(const config::Config& cfg);

// Batch buffers as torch tensors: pinned when training on CUDA (non-blocking copies).
data::BufferFactory tensor_buffers(const torch::Device& device);
torch::Tensor to_device(const data::Batch& b, const torch::Device& device);

// Validation over the first eval_iters micro-batches of `shards`, in order.
EvalResult evaluate(model::TransformerLM& model, const std::vector<data::ShardInfo>& shards,
                    const config::Config& cfg, const torch::Device& device);

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = all
  uint64_t seed = 1;
};

// Continues `prompt` token by token (context: the last seq_len tokens).
std::vector<int64_t> generate(model::TransformerLM& model, const std::vector<int64_t>& prompt,
                              int64_t seq_len, const SamplingOptions& opt,
                              const torch::Device& device);

}  // namespace moe::train
