// model.attention_backend: the SDPA priority order it sets (the chosen kernel first, torch's
// order after it), that auto restores torch's order, and that the config reaches it through
// pick_device.
#include "moe/model/attention_backend.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/train/device.h"

namespace moe::model {
namespace {

using config::AttentionBackend;

// at::SDPBackend values: math 0, flash 1, efficient 2, cudnn 3, overrideable 4.
TEST(AttentionBackend, ChosenKernelFirstOthersInTheGivenOrder) {
  const std::vector<int64_t> torch_211 = {1, 2, 0, 3, 4};
  EXPECT_EQ(attention_priority(AttentionBackend::kAuto, torch_211), torch_211);
  EXPECT_EQ(attention_priority(AttentionBackend::kCudnn, torch_211),
            (std::vector<int64_t>{3, 1, 2, 0, 4}));
  EXPECT_EQ(attention_priority(AttentionBackend::kMath, torch_211),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(attention_priority(AttentionBackend::kEfficient, {3, 1, 2, 0, 4}),
            (std::vector<int64_t>{2, 3, 1, 0, 4}));
  EXPECT_EQ(attention_priority(AttentionBackend::kFlash, torch_211), torch_211);
}

config::Config with_backend(const std::string& backend) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", 97},
                        {"seq_len", 12},
                        {"hidden_size", 16},
                        {"num_layers", 1},
                        {"num_heads", 2},
                        {"attention_backend", backend}}},
                      {"data", {{"train_path", "unused.h5"}}},
                      {"training", {{"output_dir", "unused"}, {"device", "cpu"}}}};
  config::Config cfg = config::from_json(j, "attention.json");
  config::validate(cfg);
  return cfg;
}

TEST(AttentionBackend, ConfigSetsTheProcessOrderAndAutoRestoresTorchs) {
  const std::string torch_order = attention_priority_names();
  (void)train::pick_device(with_backend("cudnn"));
  EXPECT_EQ(attention_priority_names(), "cudnn, flash, efficient, math, overrideable")
      << "torch's order was " << torch_order;
  // On the CPU the order changes nothing: the same attention either way.
  torch::manual_seed(3);
  const auto q = torch::randn({1, 2, 9, 8}), k = torch::randn({1, 2, 9, 8}),
             v = torch::randn({1, 2, 9, 8});
  const auto cudnn_first = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  (void)train::pick_device(with_backend("math"));
  EXPECT_EQ(attention_priority_names().rfind("math, ", 0), 0u) << attention_priority_names();
  (void)train::pick_device(with_backend("auto"));
  EXPECT_EQ(attention_priority_names(), torch_order);
  EXPECT_TRUE(torch::equal(at::scaled_dot_product_attention(q, k, v, {}, 0.0, true), cudnn_first));
}

TEST(AttentionBackend, UnknownNameIsRejectedWithTheChoices) {
  try {
    (void)with_backend("flash3");
    FAIL() << "accepted model.attention_backend = flash3";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.attention_backend"), std::string::npos) << what;
    EXPECT_NE(what.find("auto, flash, cudnn, efficient, math"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace moe::model
