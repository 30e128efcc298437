// Batched generation with a cache: the prompts left-padded into one batch, one prefill pass,
// then one token per row per step (model/decode_cache.h), until every row has met an EOS id,
// a stop its caller names, or its token budget. The routing is the trained one without a
// capacity limit (the caller builds the model dropless), as transformers runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/generate/sampling.h"
#include "moe/model/transformer.h"

namespace moe::generate {

struct GenerationLimits {
  int64_t max_new_tokens = 256;
  // EOS ids masked until a row has this many new tokens (transformers' min_new_tokens).
  int64_t min_new_tokens = 0;
  int64_t context = 0;           // > 0: prompt + generated tokens never exceed it
  std::vector<int64_t> eos_ids;  // any of them ends a row (and is kept as its last token)
  int64_t pad_id = 0;            // the id padding slots hold (never attended to)
};

struct Generated {
  std::vector<int64_t> ids;   // the new tokens (an ending EOS included)
  std::string finish_reason;  // "stop" (an EOS or the caller's stop) or "length"
};

// Called with each new token of each unfinished row; returns true to end that row ("stop").
using TokenCallback = std::function<bool(size_t row, int64_t token)>;

struct GenerationTimes {
  double prefill_s = 0, decode_s = 0;  // wall clock, the host synchronised after each
  int64_t prefill_tokens = 0, decode_steps = 0;
};

// `prompts`: token ids per row (none empty). `scores`, when given, receives each step's
// processed scores [B, V] (transformers' output_scores).
std::vector<Generated> generate_batch(model::TransformerLM& model,
                                      const std::vector<std::vector<int64_t>>& prompts,
                                      const SamplingParams& sampling,
                                      const GenerationLimits& limits,
                                      const TokenCallback& on_token = {},
                                      std::vector<torch::Tensor>* scores = nullptr,
                                      GenerationTimes* times = nullptr);

}  // namespace moe::generate
