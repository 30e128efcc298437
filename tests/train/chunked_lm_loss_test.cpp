// The chunked LM head + cross-entropy (train/chunked_lm_loss.h) against the head's linear and
// masked_lm_loss: the value and both gradients, for every chunk size (one row, uneven chunks,
// one chunk, a chunk larger than the batch), ignored positions, none kept, a frozen head, an
// upstream gradient scale, bf16 autocast, and through the whole model (tied and untied heads).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/train/chunked_lm_loss.h"
#include "moe/train/loss_targets.h"
#include "moe/train/step_runner.h"

namespace moe::train {
namespace {

constexpr int64_t kN = 37, kD = 16, kV = 101;

LossTargets targets_with_ignored(int64_t n, int64_t vocab, int64_t every_ignored) {
  LossTargets t;
  t.targets = torch::randint(0, vocab, {n}, torch::kLong);
  for (int64_t i = 0; i < n; i += every_ignored) t.targets[i] = kIgnoredTarget;
  t.keep = t.targets.ne(kIgnoredTarget);
  t.count = t.keep.sum().to(torch::kFloat);
  return t;
}

double rel(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max() /
          want.to(torch::kDouble).abs().max().clamp_min(1e-30))
      .item<double>();
}

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
};

Result run(const torch::Tensor& h0, const torch::Tensor& w0, const LossTargets& t, int64_t chunk,
           double upstream = 1.0, bool weight_grad = true) {
  auto h = h0.clone().requires_grad_(true);
  auto w = w0.clone().requires_grad_(weight_grad);
  torch::Tensor loss =
      chunk > 0 ? chunked_lm_loss(h, w, t, chunk)
                : masked_lm_loss(torch::nn::functional::linear(h, w).to(torch::kFloat), t);
  (loss * upstream).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(ChunkedLmLoss, MatchesTheFullHeadAndLossForEveryChunkSize) {
  torch::manual_seed(3);
  const auto h = torch::randn({kN, kD});
  const auto w = torch::randn({kV, kD}) * 0.3;
  const auto t = targets_with_ignored(kN, kV, 5);
  const Result full = run(h, w, t, 0);
  for (int64_t chunk : {1, 5, 36, 37, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Result c = run(h, w, t, chunk);
    // fp32 both ways; only the summation order differs.
    EXPECT_LT(rel(c.loss, full.loss), 1e-6);
    EXPECT_LT(rel(c.grad_hidden, full.grad_hidden), 1e-5);
    EXPECT_LT(rel(c.grad_weight, full.grad_weight), 1e-5);
    // Ignored positions get no gradient at all.
    EXPECT_TRUE(c.grad_hidden.index({t.keep.logical_not()}).eq(0).all().item<bool>());
  }
}

// Gemma's final_logit_softcapping: the chunked loss caps its logits (c tanh(z / c)) and takes
// the cap's derivative into both gradients, as autograd does through the capped head.
TEST(ChunkedLmLoss, SoftCappedLogitsMatchAutograd) {
  torch::manual_seed(5);
  const auto h0 = torch::randn({kN, kD});
  // Logits of a few units (std ~1.3): the cap of 3 bends them (tanh(1) is 0.76), and none sits
  // deep in tanh's saturation, where 1 - tanh^2 from an fp32 tanh keeps few correct digits and
  // the two paths' tanh kernels (their vector tails fall on other elements) round it apart.
  const auto w0 = torch::randn({kV, kD}) * 0.33;
  const auto t = targets_with_ignored(kN, kV, 4);
  const double cap = 3.0;
  auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  const auto z = torch::nn::functional::linear(h, w);
  const auto full = masked_lm_loss(torch::tanh(z / cap) * cap, t);
  full.backward();
  for (int64_t chunk : {1, 7, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto hc = h0.clone().requires_grad_(true), wc = w0.clone().requires_grad_(true);
    const auto loss = chunked_lm_loss(hc, wc, t, chunk, cap);
    loss.backward();
    EXPECT_LT(rel(loss.detach(), full.detach()), 1e-6);
    EXPECT_LT(rel(hc.grad(), h.grad()), 1e-5);
    EXPECT_LT(rel(wc.grad(), w.grad()), 1e-5);
  }
  // Uncapped, the same logits give another loss: the cap is really applied.
  auto hu = h0.clone(), wu = w0.clone();
  EXPECT_GT(rel(chunked_lm_loss(hu, wu, t, 7), full.detach()), 1e-3);
}

TEST(ChunkedLmLoss, UpstreamScaleFrozenHeadAndNothingKept) {
  torch::manual_seed(4);
  const auto h = torch::randn({kN, kD});
  const auto w = torch::randn({kV, kD}) * 0.3;
  const auto t = targets_with_ignored(kN, kV, 3);
  const Result full = run(h, w, t, 0, 1024.0);
  const Result c = run(h, w, t, 8, 1024.0);  // a loss scale multiplies both gradients
  EXPECT_LT(rel(c.grad_hidden, full.grad_hidden), 1e-5);
  EXPECT_LT(rel(c.grad_weight, full.grad_weight), 1e-5);
  const Result frozen = run(h, w, t, 8, 1.0, /*weight_grad=*/false);
  EXPECT_FALSE(frozen.grad_weight.defined());
  EXPECT_LT(rel(frozen.grad_hidden, run(h, w, t, 0, 1.0, false).grad_hidden), 1e-5);
  // Every position ignored (a micro-batch that is all prompt): 0, not NaN, and zero gradients.
  auto none = targets_with_ignored(kN, kV, 1);
  const Result z = run(h, w, none, 8);
  EXPECT_EQ(z.loss.item<float>(), 0.0f);
  EXPECT_TRUE(z.grad_hidden.eq(0).all().item<bool>());
  EXPECT_TRUE(z.grad_weight.eq(0).all().item<bool>());
}

// Both multiply 16-bit operands (the logits round alike); their gradients' 16-bit operands
// round alike, the chunked weight gradient adds chunks in fp32 (under fp16 its product is fp32).
// Against each other: within a few 16-bit ulps of the largest value; and both really are 16-bit
// (they differ from the fp32 head by more than fp32 rounding would).
TEST(ChunkedLmLoss, FollowsBf16AndFp16Autocast) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(dtype == torch::kHalf ? "fp16" : "bf16");
    torch::manual_seed(5);
    const auto h = torch::randn({kN, kD});
    const auto w = torch::randn({kV, kD}) * 0.3;
    const auto t = targets_with_ignored(kN, kV, 6);
    const bool was = at::autocast::is_autocast_enabled(at::kCPU);
    const auto was_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
    const Result full = run(h, w, t, 0);
    const Result c = run(h, w, t, 8);
    at::autocast::set_autocast_enabled(at::kCPU, was);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype);
    at::autocast::clear_cache();
    const Result f32 = run(h, w, t, 0);
    EXPECT_LT(rel(c.loss, full.loss), 1e-3);
    EXPECT_LT(rel(c.grad_hidden, full.grad_hidden), 2e-2);
    EXPECT_LT(rel(c.grad_weight, full.grad_weight), 2e-2);
    EXPECT_GT(rel(c.grad_hidden, f32.grad_hidden), 1e-5);
    EXPECT_EQ(c.grad_hidden.scalar_type(), torch::kFloat);
  }
}

// Under no_grad (nothing will call the backward) only the loss is computed: the same value.
TEST(ChunkedLmLoss, NoGradComputesTheLossOnly) {
  torch::manual_seed(8);
  const auto h = torch::randn({kN, kD}).requires_grad_(true);
  const auto w = (torch::randn({kV, kD}) * 0.3).requires_grad_(true);
  const auto t = targets_with_ignored(kN, kV, 4);
  torch::NoGradGuard no_grad;
  const auto loss = chunked_lm_loss(h, w, t, 8);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_LT(rel(loss, masked_lm_loss(torch::nn::functional::linear(h, w), t)), 1e-6);
}

config::Config model_config(bool tied, int64_t chunk) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", 97},
                        {"seq_len", 12},
                        {"hidden_size", 16},
                        {"num_layers", 2},
                        {"num_heads", 2},
                        {"tie_embeddings", tied}}},
                      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 24}}},
                      {"data", {{"train_path", "unused.h5"}}},
                      {"training", {{"output_dir", "unused"}, {"head_chunk_tokens", chunk}}}};
  config::Config cfg = config::from_json(j, "chunked.json");
  config::validate(cfg);
  return cfg;
}

TEST(ChunkedLmLoss, TrainsTheModelLikeTheFullHead) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied head" : "own head");
    torch::manual_seed(6);
    const auto batch = torch::randint(0, 97, {2, 13}, torch::kLong);
    std::vector<std::vector<torch::Tensor>> grads;
    std::vector<double> losses;
    for (int64_t chunk : {0, 7}) {
      const config::Config cfg = model_config(tied, chunk);
      torch::manual_seed(7);
      model::TransformerLM model(cfg);
      model->train();
      MicroLosses l = compute_losses(model, batch, cfg);
      l.total.backward();
      losses.push_back(l.lm.item<double>());
      std::vector<torch::Tensor> g;
      for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
      grads.push_back(g);
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-6 * losses[0]);
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_LT(rel(grads[1][i], grads[0][i]), 1e-4) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace moe::train
