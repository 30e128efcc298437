// cpu_checkpointing on a GPU (DeepSpeed's name): the checkpointed blocks' inputs wait for the
// backward in pinned host memory. Same loss and gradients, bitwise (the recompute reads the same
// values back), and less device memory held between the forward and the backward.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

config::Config config_with(bool on_host) {
  nlohmann::json j = {
      {"train_batch_size", 4},
      {"model",
       {{"vocab_size", 128},
        {"seq_len", 256},
        {"hidden_size", 256},
        {"num_layers", 4},
        {"num_heads", 4},
        {"rope_theta", 10000.0}}},
      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 128}}},
      {"activation_checkpointing", {{"number_checkpoints", 4}, {"cpu_checkpointing", on_host}}},
      {"data", {{"train_path", "unused.h5"}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

// Device bytes the caching allocator has handed out now.
int64_t allocated_now() {
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current;
}

TEST(ActivationCheckpointGpu, HostCheckpointsGiveTheSameGradientsWithLessDeviceMemory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(5);
  const auto tokens = torch::randint(0, 128, {4, 256}, torch::kLong).to(cuda);
  struct Run {
    torch::Tensor loss;
    std::vector<torch::Tensor> grads;
    int64_t held = 0;  // device bytes allocated after the forward, before the backward
  };
  auto run = [&](bool on_host) {
    torch::manual_seed(1);
    TransformerLM model(config_with(on_host));
    model->to(cuda);
    model->train();
    torch::cuda::synchronize();
    const int64_t before = allocated_now();
    auto out = model->forward(tokens);
    auto loss = out.logits.to(torch::kFloat).square().mean() + 0.01 * out.aux_loss;
    torch::cuda::synchronize();
    Run r;
    r.held = allocated_now() - before;
    loss.backward();
    r.loss = loss.detach().cpu();
    for (auto& p : model->parameters()) r.grads.push_back(p.grad().cpu());
    return r;
  };
  const Run device = run(false), host = run(true);
  EXPECT_TRUE(torch::equal(device.loss, host.loss));
  ASSERT_EQ(device.grads.size(), host.grads.size());
  for (size_t i = 0; i < device.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(device.grads[i], host.grads[i])) << "parameter " << i;
  }
  // Four inputs of [4, 256, 256] fp32 (1 MiB each) no longer held on the device.
  EXPECT_LE(host.held, device.held - 3 * (int64_t{1} << 20))
      << "device " << device.held << " B, host checkpoints " << host.held << " B";
}

}  // namespace
}  // namespace moe::model
