// Dense FFN layers mixed with MoE layers (Qwen3-MoE's decoder_sparse_step / mlp_only_layers) and
// the OLMoE-style full-width q/k norm: which layers are which, parameter counts, and that the
// per-MoE-layer bookkeeping (loads, expert biases, activation checkpointing) skips dense layers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/activation_checkpoint.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

config::Config mixed_config(nlohmann::json model_extra = nlohmann::json::object(),
                            nlohmann::json moe_extra = nlohmann::json::object()) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", 40},
                        {"seq_len", 10},
                        {"hidden_size", 16},
                        {"num_layers", 4},
                        {"num_heads", 4},
                        {"num_key_value_heads", 2},
                        {"rope_theta", 10000.0},
                        {"dense_hidden_size", 20}}},
                      {"moe",
                       {{"num_experts", 4},
                        {"top_k", 2},
                        {"expert_hidden_size", 12},
                        {"decoder_sparse_step", 2},
                        {"mlp_only_layers", {3}}}},
                      {"data", {{"train_path", "unused.h5"}}}};
  if (!model_extra.is_null()) j["model"].update(model_extra);  // {} reads as null
  if (!moe_extra.is_null()) j["moe"].update(moe_extra);
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

int64_t numel(TransformerLM& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(DenseLayers, DecoderSparseStepAndMlpOnlyLayersChooseTheKinds) {
  const config::Config c = mixed_config();
  // (i + 1) % 2 == 0 -> layers 1 and 3; layer 3 is in mlp_only_layers.
  const std::vector<bool> want = {false, true, false, false};
  TransformerLM m(c);
  ASSERT_EQ(m->blocks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(config::is_moe_layer(c, static_cast<int64_t>(i)), want[i]) << i;
    EXPECT_EQ(m->blocks[i]->is_moe(), want[i]) << i;
    EXPECT_EQ(m->blocks[i]->mlp.is_empty(), want[i]) << i;
  }
  EXPECT_EQ(config::moe_layer_count(c), 1);
  EXPECT_EQ(m->blocks[0]->mlp->gate_proj->weight.sizes(), torch::IntArrayRef({20, 16}));
  auto out = m->forward(torch::randint(0, 40, {2, 10}, torch::kLong));
  ASSERT_EQ(out.tokens_per_expert.size(), 1u);  // MoE layers only
  EXPECT_EQ(out.tokens_per_expert[0].sum().item<int64_t>(), 2 * 10 * 2);
}

TEST(DenseLayers, ParameterCountsMatchTheModel) {
  for (const auto& [model_extra, moe_extra] :
       std::vector<std::pair<nlohmann::json, nlohmann::json>>{
           {{}, {}},
           {{{"qk_norm", true}, {"qk_norm_scope", "full"}}, {{"decoder_sparse_step", 1}}},
           {{{"qk_norm", true}, {"tie_embeddings", false}}, {{"mlp_only_layers", {0, 2}}}}}) {
    const config::Config c = mixed_config(model_extra, moe_extra);
    TransformerLM m(c);
    EXPECT_EQ(config::count_parameters(c), numel(m)) << model_extra << moe_extra;
    int64_t from_costs = 0;
    for (const auto& k : config::module_costs(c)) from_costs += k.params * k.count;
    EXPECT_EQ(from_costs, numel(m)) << model_extra << moe_extra;
  }
}

TEST(DenseLayers, FullWidthQkNormCoversAllHeads) {
  const config::Config c = mixed_config({{"qk_norm", true}, {"qk_norm_scope", "full"}});
  TransformerLM m(c);
  EXPECT_EQ(m->blocks[0]->attn->q_norm->weight.numel(), 4 * 4);  // heads x head_dim
  EXPECT_EQ(m->blocks[0]->attn->k_norm->weight.numel(), 2 * 4);  // kv heads x head_dim
  // A per-head weight that differs between heads changes the output only if it is full-width.
  torch::NoGradGuard g;
  auto x = torch::randint(0, 40, {1, 10}, torch::kLong);
  auto before = m->forward(x).logits.clone();
  m->blocks[0]->attn->q_norm->weight.narrow(0, 4, 4).mul_(3.0);  // head 1 only
  EXPECT_FALSE(torch::allclose(before, m->forward(x).logits));
}

TEST(DenseLayers, ExpertBiasUpdatesReachTheMoeLayer) {
  const config::Config c = mixed_config({}, {{"router_bias_update_rate", 0.1}});
  TransformerLM m(c);
  m->after_optimizer_step({torch::tensor({10, 0, 0, 0}, torch::kLong)});
  auto bias = m->blocks[1]->moe->router->expert_bias;
  EXPECT_LT(bias[0].item<float>(), 0);  // the overloaded expert is pushed down
  EXPECT_GT(bias[1].item<float>(), 0);
}

TEST(DenseLayers, ActivationCheckpointingKeepsLossAndGradients) {
  torch::manual_seed(2);
  TransformerLM m(mixed_config({{"dropout", 0.1}}));
  m->train();
  auto tokens = torch::randint(0, 40, {2, 10}, torch::kLong);
  auto run = [&] {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(9);
    auto out = m->forward(tokens);
    auto loss = out.logits.square().mean() + 0.01 * out.aux_loss;
    loss.backward();
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone());
    return std::pair{loss.detach(), g};
  };
  auto [plain_loss, plain] = run();
  m->set_checkpoint_blocks(4);
  const int64_t before = checkpoint_recomputations();
  auto [ckpt_loss, ckpt] = run();
  EXPECT_EQ(checkpoint_recomputations() - before, 4);
  EXPECT_TRUE(torch::equal(plain_loss, ckpt_loss));
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], ckpt[i], 1e-5, 1e-7)) << i;
  }
}

}  // namespace
}  // namespace moe::model
