#include "moe/generate/sampling.h"

#include <algorithm>
#include <limits>

#include <torch/torch.h>

namespace moe::generate {

namespace {

constexpr float kRemoved = -std::numeric_limits<float>::infinity();

// RepetitionPenaltyLogitsProcessor: a seen token's logit divided by the penalty when positive,
// multiplied when negative.
torch::Tensor penalize_repeats(const torch::Tensor& s, const torch::Tensor& seen, double penalty) {
  const auto penalized = torch::where(s < 0, s * penalty, s / penalty);
  return torch::where(seen, penalized, s);
}

// TopKLogitsWarper: below the k-th largest -> removed.
torch::Tensor top_k(const torch::Tensor& s, int64_t k) {
  k = std::min<int64_t>(k, s.size(-1));
  const auto kth = std::get<0>(s.topk(k)).narrow(-1, k - 1, 1);
  return s.masked_fill(s < kth, kRemoved);
}

// TopPLogitsWarper: ascending order, the tokens whose cumulative probability is at most 1 - p
// removed, the most likely always kept.
torch::Tensor top_p(const torch::Tensor& s, double p) {
  const auto [sorted, order] = s.sort(/*dim=*/-1, /*descending=*/false);
  auto remove = sorted.softmax(-1).cumsum(-1) <= (1 - p);
  remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);
  return s.masked_fill(remove.scatter(1, order, remove), kRemoved);
}

// MinPLogitsWarper: probability below min_p times the top one's -> removed, the top kept.
torch::Tensor min_p(const torch::Tensor& s, double min_p) {
  const auto probs = s.softmax(-1);
  auto remove = probs < min_p * std::get<0>(probs.max(-1, /*keepdim=*/true));
  remove.scatter_(-1, std::get<1>(probs.topk(1, -1)), false);
  return s.masked_fill(remove, kRemoved);
}

}  // namespace

torch::Tensor process_logits(const torch::Tensor& logits, const torch::Tensor& seen,
                             const SamplingParams& p, const std::vector<int64_t>& suppressed) {
  auto s = logits.to(torch::kFloat);
  if (p.repetition_penalty != 1.0) s = penalize_repeats(s, seen, p.repetition_penalty);
  for (const int64_t id : suppressed) {
    if (id >= 0 && id < s.size(-1)) s.select(-1, id).fill_(kRemoved);
  }
  if (!p.do_sample) return s;
  if (p.temperature != 1.0) s = s / p.temperature;
  if (p.top_k != 0) s = top_k(s, p.top_k);
  if (p.top_p < 1.0) s = top_p(s, p.top_p);
  if (p.min_p) s = min_p(s, *p.min_p);
  return s;
}

torch::Tensor choose_tokens(const torch::Tensor& scores, const SamplingParams& p,
                            at::Generator& rng) {
  if (!p.do_sample) return scores.argmax(-1);
  const auto probs = scores.softmax(-1).to(torch::kCPU);
  return torch::multinomial(probs, 1, false, rng).squeeze(1).to(scores.device());
}

}  // namespace moe::generate
