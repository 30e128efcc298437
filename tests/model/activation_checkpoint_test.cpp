// Activation checkpointing changes memory, not math: same loss and gradients, dropout included.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/activation_checkpoint.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

config::Config small_config() {
  nlohmann::json j = {
      {"train_batch_size", 2},
      {"model",
       {{"vocab_size", 50},
        {"seq_len", 12},
        {"hidden_size", 16},
        {"num_layers", 3},
        {"num_heads", 2},
        {"dropout", 0.2}}},
      {"moe",
       {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 24}, {"expert_dropout", 0.1}}},
      {"data", {{"train_path", "unused.h5"}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

std::pair<torch::Tensor, std::vector<torch::Tensor>> loss_and_grads(TransformerLM& m,
                                                                    const torch::Tensor& tokens) {
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(99);  // same dropout masks in both runs
  auto out = m->forward(tokens);
  auto loss = out.logits.square().mean() + 0.01 * out.aux_loss + 0.001 * out.z_loss;
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : m->parameters()) grads.push_back(p.grad().clone());
  return {loss.detach(), grads};
}

TEST(ActivationCheckpointing, SameLossAndGradients) {
  torch::manual_seed(1);
  TransformerLM model(small_config());
  model->train();
  auto tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
  auto [loss_plain, grads_plain] = loss_and_grads(model, tokens);
  for (int64_t n : {1, 3}) {
    model->set_checkpoint_blocks(n);
    const int64_t before = checkpoint_recomputations();
    auto [loss_ckpt, grads_ckpt] = loss_and_grads(model, tokens);
    EXPECT_EQ(checkpoint_recomputations() - before, n);  // it really recomputed n blocks
    EXPECT_TRUE(torch::allclose(loss_plain, loss_ckpt, 0, 0)) << n << " checkpointed blocks";
    ASSERT_EQ(grads_plain.size(), grads_ckpt.size());
    for (size_t i = 0; i < grads_plain.size(); ++i) {
      EXPECT_TRUE(torch::allclose(grads_plain[i], grads_ckpt[i], 1e-5, 1e-7))
          << "parameter " << i << " with " << n << " checkpointed blocks";
    }
  }
}

// The recompute runs under the forward's autocast, although the trainer switches autocast off
// before the backward: a bf16 forward is recomputed in bf16, so the gradients are the plain
// run's (an fp32 recompute differs at bf16's rounding).
TEST(ActivationCheckpointing, RecomputesUnderTheForwardsAutocast) {
  torch::manual_seed(3);
  config::Config c = small_config();
  c.model.dropout = 0;
  c.moe.expert_dropout = 0;
  TransformerLM model(c);
  model->train();
  const auto tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
  auto run = [&](int64_t checkpointed) {
    model->set_checkpoint_blocks(checkpointed);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    auto out = model->forward(tokens);
    at::autocast::set_autocast_enabled(at::kCPU, false);  // as the step runner does
    (out.logits.to(torch::kFloat).square().mean() + 0.01 * out.aux_loss).backward();
    at::autocast::clear_cache();
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "the caller's state restored";
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = run(0), checkpointed = run(3);
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    worst = std::max(
        worst, ((checkpointed[i] - plain[i]).abs().max() / plain[i].abs().max().clamp_min(1e-30))
                   .item<double>());
  }
  EXPECT_LT(worst, 1e-5) << "a checkpointed block's gradients are not the plain run's";
}

// A capacity limit's drops are reported by checkpointed blocks too (they used to say 0).
TEST(ActivationCheckpointing, ReportsCapacityDrops) {
  config::Config c = small_config();
  c.moe.capacity_factor = 0.5;
  torch::manual_seed(2);
  TransformerLM model(c);
  model->train();
  const auto tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
  torch::manual_seed(7);
  const int64_t plain = model->forward(tokens).dropped;
  ASSERT_GT(plain, 0);
  model->set_checkpoint_blocks(3);
  torch::manual_seed(7);
  EXPECT_EQ(model->forward(tokens).dropped, plain);
}

}  // namespace
}  // namespace moe::model
