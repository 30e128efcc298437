// LoRA adapters (src/layers/lora.cpp, config/lora.cpp): a new adapter leaves the model's function
// unchanged, merging folds it in without changing the function, the base is frozen, the planner's
// parameter counts are the model's, and the config refuses what PEFT cannot express.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/layers/lora.h"
#include "moe/model/transformer.h"
#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::layers {
namespace {

using namespace model;  // the adapters and 4-bit weights inside whole models

// 4 layers: MoE, dense (mlp_only_layers), MoE, MoE; GQA, rotary, per-head q/k norm.
config::Config lora_config(nlohmann::json lora) {
  nlohmann::json j = {
      {"train_batch_size", 2},
      {"model",
       {{"vocab_size", 40},
        {"seq_len", 10},
        {"hidden_size", 16},
        {"num_layers", 4},
        {"num_heads", 4},
        {"num_key_value_heads", 2},
        {"rope_theta", 10000.0},
        {"qk_norm", true},
        {"tie_embeddings", false},
        {"dense_hidden_size", 20}}},
      {"moe",
       {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 12}, {"mlp_only_layers", {1}}}},
      {"lora", lora},
      {"data", {{"train_path", "unused.h5"}}}};
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

const nlohmann::json kAll = {
    {"r", 4},
    {"lora_alpha", 8},
    {"target_modules",
     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "dense_mlp"}},
    {"modules_to_save", {"gate", "norm"}}};

// Every adapter's B set to random values: the adapters now change the function.
void randomise_updates(TransformerLM& m) {
  torch::NoGradGuard g;
  for (auto& item : m->named_parameters()) {
    if (item.key().ends_with("lora_B")) item.value().normal_(0.0, 0.1);
  }
}

torch::Tensor tokens() { return torch::randint(0, 40, {2, 10}); }

TEST(Lora, NewAdaptersLeaveTheFunctionUnchanged) {
  torch::manual_seed(3);
  TransformerLM base(lora_config({{"r", 0}}));
  torch::manual_seed(3);
  TransformerLM adapted(lora_config(kAll));
  auto b = base->named_parameters();
  torch::NoGradGuard g;
  for (auto& item : adapted->named_parameters()) {
    if (!config::is_lora_parameter(item.key())) item.value().copy_(b[item.key()]);
  }
  base->eval(), adapted->eval();
  const auto t = tokens();
  EXPECT_TRUE(torch::equal(base->forward(t).logits, adapted->forward(t).logits));
  randomise_updates(adapted);
  EXPECT_GT((base->forward(t).logits - adapted->forward(t).logits).abs().max().item<float>(), 1e-3);
}

TEST(Lora, MergingKeepsTheFunction) {
  torch::manual_seed(5);
  TransformerLM m(lora_config(kAll));
  randomise_updates(m);
  m->eval();
  const auto t = tokens();
  torch::NoGradGuard g;
  const auto before = m->forward(t).logits;
  m->merge_lora();
  for (auto& item : m->named_parameters()) {
    if (item.key().ends_with("lora_B")) {
      EXPECT_EQ(item.value().abs().sum().item<float>(), 0.f);
    }
  }
  EXPECT_TRUE(torch::allclose(before, m->forward(t).logits, 1e-5, 1e-5));
}

TEST(Lora, BaseIsFrozenAndCountsMatchThePlanner) {
  const config::Config c = lora_config(kAll);
  TransformerLM m(c);
  int64_t adapter = 0, saved = 0, frozen = 0;
  for (const auto& item : m->named_parameters()) {
    const bool lora = config::is_lora_parameter(item.key());
    const bool trains = item.value().requires_grad();
    if (lora) {
      EXPECT_TRUE(trains) << item.key();
      adapter += item.value().numel();
    } else if (trains) {
      EXPECT_TRUE(item.key().find("router") != std::string::npos ||
                  item.key().find("norm") != std::string::npos)
          << item.key() << " trains but is not in modules_to_save";
      saved += item.value().numel();
    } else {
      frozen += item.value().numel();
    }
  }
  const config::LoraParameterCounts n = config::lora_parameter_counts(c);
  EXPECT_EQ(n.adapter, adapter);
  EXPECT_EQ(n.trainable_base, saved);
  EXPECT_EQ(n.frozen_base, frozen);
  const auto all = m->named_parameters();
  EXPECT_EQ(static_cast<int64_t>(trainable_parameters(*m).size()),
            static_cast<int64_t>(std::count_if(
                all.begin(), all.end(), [](const auto& i) { return i.value().requires_grad(); })));
  // PEFT's gate_proj + up_proj on the experts: one gate_up adapter of rank 2r.
  const auto& gu = m->blocks[0]->moe->experts->lora_gate_up;
  ASSERT_TRUE(gu);
  EXPECT_EQ(gu->lora_A.sizes(), (std::vector<int64_t>{4, 16, 8}));
  EXPECT_EQ(gu->lora_B.sizes(), (std::vector<int64_t>{4, 8, 24}));
}

TEST(Lora, BaseFingerprintSeesEveryFrozenValueAndNothingThatTrains) {
  torch::manual_seed(7);
  TransformerLM m(lora_config(kAll));
  const std::string f = base_fingerprint(*m);
  randomise_updates(m);
  EXPECT_EQ(base_fingerprint(*m), f) << "adapters are not part of the base";
  torch::NoGradGuard g;
  auto w = m->blocks[2]->moe->experts->w_down;
  w.view(-1)[5] += 1e-6f;
  EXPECT_NE(base_fingerprint(*m), f);
  const std::string g2 = base_fingerprint(*m);
  m->blocks[0]->moe->router->weight.view(-1)[0] += 1.0f;  // modules_to_save "gate": it trains
  EXPECT_EQ(base_fingerprint(*m), g2) << "what modules_to_save trains is not the base";
}

// A GPU run holds its frozen matrices in bf16; a CPU export of its checkpoint holds them in fp32
// and must reach the same fingerprint by rounding them the same way, and an fp32 checkpoint must
// load into a 16-bit base.
TEST(Lora, SixteenBitBaseFingerprintAndLoad) {
  torch::manual_seed(9);
  const config::Config c = lora_config(kAll);
  TransformerLM fp32(c), bf16(c);
  {
    torch::NoGradGuard g;
    auto dst = bf16->named_parameters();
    for (auto& item : fp32->named_parameters()) {
      auto& p = dst[item.key()];
      p.copy_(item.value());
      if (held_in_16_bits(item.key(), p)) p.set_data(p.to(torch::kBFloat16));
    }
  }
  EXPECT_EQ(bf16->blocks[0]->attn->qkv->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(bf16->blocks[0]->moe->router->weight.scalar_type(), torch::kFloat)
      << "routers stay fp32";
  EXPECT_EQ(base_fingerprint(*fp32, torch::kBFloat16), base_fingerprint(*bf16, torch::kBFloat16));
  EXPECT_NE(base_fingerprint(*fp32, torch::kFloat), base_fingerprint(*fp32, torch::kBFloat16));
  EXPECT_EQ(lora_base_dtype(c, torch::Device(torch::kCPU)), torch::kFloat);

  // An fp32 weights checkpoint (an import) loads into the 16-bit base, rounded as .to(bf16).
  const auto dir =
      std::filesystem::temp_directory_path() / ("moe-lora-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  checkpoint::TrainingState state;
  state.config = config::to_json(lora_config({{"r", 0}}));
  TransformerLM plain(lora_config({{"r", 0}}));
  {
    torch::NoGradGuard g;
    auto src = fp32->named_parameters();
    for (auto& item : plain->named_parameters()) item.value().copy_(src[item.key()]);
  }
  checkpoint::save_weights_checkpoint(dir.string(), plain, state, nlohmann::json::object());
  {
    torch::NoGradGuard g;
    bf16->blocks[1]->attn->qkv->weight.zero_();
  }
  checkpoint::load_checkpoint(dir.string(), bf16, nullptr, false);
  EXPECT_TRUE(torch::equal(bf16->blocks[1]->attn->qkv->weight,
                           fp32->blocks[1]->attn->qkv->weight.to(torch::kBFloat16)));
  ::moe::remove_tree(dir);
}

TEST(Lora, ConfigRefusesWhatCannotBeExpressed) {
  auto message = [](nlohmann::json lora) {
    try {
      lora_config(lora);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({{"r", 4}, {"target_modules", {"q_proj", "gate_proj"}}}).find("up_proj"),
            std::string::npos);
  EXPECT_NE(message({{"r", 4}, {"target_modules", {"qkv"}}}).find("lora.target_modules[0]"),
            std::string::npos);
  EXPECT_NE(message({{"r", 4}, {"modules_to_save", {"router"}}}).find("lora.modules_to_save[0]"),
            std::string::npos);
  EXPECT_NE(message({{"r", 4}, {"target_modules", nlohmann::json::array()}}).find("at least one"),
            std::string::npos);
  EXPECT_EQ(message({{"r", 4}, {"target_modules", {"gate_up_proj", "w2"}}}), "(accepted)");
}

}  // namespace
}  // namespace moe::layers
