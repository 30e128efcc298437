#include "moe/generate/generator.h"

#include <algorithm>
#include <chrono>

#include <torch/torch.h>

#include "moe/model/decode_cache.h"

namespace moe::generate {

namespace {

double elapsed_seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The prompts left-padded into tokens [B, L] with their real slots `valid` and the rotary
// positions (real tokens counted from 0; padding slots 1, as transformers fills them).
struct PaddedBatch {
  torch::Tensor tokens, valid, positions;
};

PaddedBatch left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t L = 0;
  for (const auto& p : prompts) L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
  PaddedBatch b;
  b.tokens = torch::full({B, L}, pad_id, torch::kLong);
  b.valid = torch::zeros({B, L}, torch::kBool);
  for (int64_t r = 0; r < B; ++r) {
    const auto& p = prompts[r];
    const int64_t n = static_cast<int64_t>(p.size()), first = L - n;
    b.tokens[r].narrow(0, first, n).copy_(torch::tensor(p, torch::kLong));
    b.valid[r].narrow(0, first, n).fill_(true);
  }
  b.positions = (b.valid.to(torch::kLong).cumsum(1) - 1).masked_fill(b.valid.logical_not(), 1);
  return b;
}

}  // namespace

std::vector<Generated> generate_batch(model::TransformerLM& model,
                                      const std::vector<std::vector<int64_t>>& prompts,
                                      const SamplingParams& sampling,
                                      const GenerationLimits& limits, const TokenCallback& on_token,
                                      std::vector<torch::Tensor>* scores, GenerationTimes* times) {
  torch::NoGradGuard no_grad;
  model::BaseDtypeAutocast autocast(model);
  model->eval();
  const auto device = model->parameters().front().device();
  const int64_t B = static_cast<int64_t>(prompts.size());
  PaddedBatch batch = left_pad(prompts, limits.pad_id);
  const int64_t L = batch.tokens.size(1);
  int64_t budget = limits.max_new_tokens;
  if (limits.context > 0) budget = std::min(budget, limits.context - L);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(sampling.seed);
  model::DecodeStep step;
  step.positions = batch.positions.to(device);
  step.valid = batch.valid.to(device);
  std::vector<model::LayerCache> caches;
  auto t0 = std::chrono::steady_clock::now();
  auto logits = model->decode(batch.tokens.to(device), step, caches);
  synchronize(device);
  if (times) times->prefill_s += elapsed_seconds(t0), times->prefill_tokens += B * L;

  const int64_t V = logits.size(-1);
  auto seen = torch::zeros({B, V}, torch::kBool);  // real tokens so far (repetition penalty)
  for (int64_t r = 0; r < B; ++r)
    seen[r].index_fill_(0, torch::tensor(prompts[r], torch::kLong).clamp(0, V - 1), true);
  seen = seen.to(device);
  std::vector<Generated> out(B);
  std::vector<bool> done(B, false);
  int64_t unfinished = B;
  t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < budget && unfinished > 0; ++n) {
    const auto processed =
        process_logits(logits, seen, sampling,
                       n < limits.min_new_tokens ? limits.eos_ids : std::vector<int64_t>{});
    if (scores) scores->push_back(processed.to(torch::kCPU));
    const auto next = choose_tokens(processed, sampling, gen).to(torch::kCPU);
    auto chosen = next.accessor<int64_t, 1>();
    std::vector<int64_t> fed(B, limits.pad_id);  // finished rows are fed padding
    for (int64_t r = 0; r < B; ++r) {
      if (done[r]) continue;
      const int64_t t = chosen[r];
      out[r].ids.push_back(t);
      fed[r] = t;
      const bool eos =
          std::find(limits.eos_ids.begin(), limits.eos_ids.end(), t) != limits.eos_ids.end();
      if (eos || (on_token && on_token(static_cast<size_t>(r), t))) {
        out[r].finish_reason = "stop";
        done[r] = true;
        --unfinished;
      }
    }
    if (unfinished == 0 || n + 1 == budget) break;
    const auto fed_t = torch::tensor(fed, torch::kLong).to(device);
    seen.scatter_(1, fed_t.unsqueeze(1), true);
    step.past += step.positions.size(1);
    step.valid = torch::cat({step.valid, torch::ones({B, 1}, step.valid.options())}, 1);
    step.positions = (step.valid.to(torch::kLong).sum(1, /*keepdim=*/true) - 1);
    logits = model->decode(fed_t.unsqueeze(1), step, caches);
    if (times) ++times->decode_steps;
  }
  synchronize(device);
  if (times) times->decode_s += elapsed_seconds(t0);
  for (auto& g : out) {
    if (g.finish_reason.empty()) g.finish_reason = "length";
  }
  return out;
}

}  // namespace moe::generate
