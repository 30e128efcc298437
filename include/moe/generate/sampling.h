// How the next token is chosen from the logits, as transformers' generate defines it: the
// repetition penalty over each row's real tokens (prompt padding ignored), then, when sampling,
// temperature, top-k, top-p and min-p in that order (its logits processors and warpers, the same
// arithmetic), then a draw from the softmax; greedy takes the argmax.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "moe/generate/sampling_params.h"

namespace moe::generate {

// The processed scores [B, V] fp32 (-inf where a warper removed a token): what transformers'
// output_scores returns. `seen` [B, V] bool marks each row's tokens so far (prompt and
// generated, padding left out), for the repetition penalty. `suppressed`: ids set to -inf after
// the penalty, before the warpers (transformers' MinNewTokensLengthLogitsProcessor masks the EOS
// ids so while a row is short of min_new_tokens).
torch::Tensor process_logits(const torch::Tensor& logits, const torch::Tensor& seen,
                             const SamplingParams& p, const std::vector<int64_t>& suppressed = {});

// The next token of each row [B] from processed scores: argmax, or a draw from their softmax.
torch::Tensor choose_tokens(const torch::Tensor& scores, const SamplingParams& p,
                            at::Generator& rng);

}  // namespace moe::generate
