// Generation's cache (model/decode_cache.h): the masks and the rolling window of attend_cached,
// and TransformerLM::decode run as a prefill and then a token per step gives, at every position,
// the logits of one ordinary forward over the whole sequence: for grouped-query attention with
// sliding windows and sinks, latent attention and a Gated DeltaNet hybrid, with a left-padded row
// equal to its prompt run alone. transformers' generate is the oracle of
// tests/generate/generate_test.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/model/decode_cache.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

TEST(DecodeCache, AttendCachedMasksPaddingAndKeepsTheWindow) {
  // Row 1 has two padding slots; window 3: a query sees itself and the two slots before it.
  DecodeStep step;
  step.valid = torch::tensor({{true, true, true, true, true}, {false, false, true, true, true}});
  step.positions = torch::tensor({{0, 1, 2, 3, 4}, {1, 1, 0, 1, 2}});
  LayerCache cache;
  const auto k = torch::randn({2, 1, 5, 4}), v = torch::randn({2, 1, 5, 4});
  const auto a = attend_cached(cache, step, k, v, 3);
  ASSERT_EQ(a.mask.sizes(), (std::vector<int64_t>{2, 1, 5, 5}));
  const auto m0 = a.mask[0][0], m1 = a.mask[1][0];
  EXPECT_TRUE(m0[4][2].item<bool>() && m0[4][4].item<bool>());
  EXPECT_FALSE(m0[4][1].item<bool>());  // outside the window
  EXPECT_FALSE(m0[1][2].item<bool>());  // causal
  EXPECT_FALSE(m1[3][1].item<bool>());  // padding is never attended to...
  EXPECT_TRUE(m1[1][1].item<bool>());   // ...except by itself (no empty softmax row)
  EXPECT_FALSE(m1[1][0].item<bool>());
  // The next query (slot 5) needs slots 3 and 4 only.
  EXPECT_EQ(cache.k.size(2), 2);
  EXPECT_EQ(cache.first_slot, 3);
  EXPECT_TRUE(torch::equal(cache.k, k.narrow(2, 3, 2)));
  step.past = 5;
  step.valid = torch::cat({step.valid, torch::ones({2, 1}, torch::kBool)}, 1);
  const auto b =
      attend_cached(cache, step, torch::randn({2, 1, 1, 4}), torch::randn({2, 1, 1, 4}), 3);
  EXPECT_EQ(b.k.size(2), 3);
  EXPECT_TRUE(b.mask.all().item<bool>());
}

config::Config model_config(const nlohmann::json& model,
                            const nlohmann::json& top = nlohmann::json::object()) {
  nlohmann::json m = {{"vocab_size", 64},      {"seq_len", 64},          {"hidden_size", 32},
                      {"num_layers", 2},       {"num_heads", 4},         {"num_key_value_heads", 2},
                      {"rope_theta", 10000.0}, {"tie_embeddings", false}};
  m.update(model);
  nlohmann::json j = {{"train_batch_size", 1},
                      {"model", m},
                      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 48}}},
                      {"data", {{"train_path", "unused.h5"}}}};
  j.update(top);
  config::Config c = config::from_json(j, "decode.json");
  config::validate(c);
  return c;
}

// The logits of `tokens` [1, S] at positions [from, S) by one forward.
torch::Tensor full_logits(TransformerLM& m, const torch::Tensor& tokens, int64_t from) {
  return m->forward(tokens).logits[0].narrow(0, from, tokens.size(1) - from);
}

// Rows of different lengths: row 0 the whole sequence, row 1 its last `short_len` tokens,
// left-padded; a prefill of `prompt` slots, then a token per step.
// `prepare` runs on the model before the comparison (e.g. gives LoRA adapters a nonzero
// update); returns the caches after the last step.
std::vector<LayerCache> expect_stepwise_equals_full(
    const config::Config& cfg, const std::function<void(TransformerLM&)>& prepare = {}) {
  torch::manual_seed(4);
  TransformerLM m(cfg);
  m->eval();
  torch::NoGradGuard g;
  if (prepare) prepare(m);
  const int64_t S = 14, prompt = 6, short_len = 10, pad = S - short_len;
  const auto seq = torch::randint(0, 64, {1, S}, torch::kLong);
  const auto shorter = seq.narrow(1, pad, short_len);
  const auto want0 = full_logits(m, seq, prompt - 1);
  const auto want1 = full_logits(m, shorter, prompt - 1 - pad);
  auto tokens = torch::cat({seq, torch::cat({torch::zeros({1, pad}, torch::kLong), shorter}, 1)});
  auto valid = torch::ones({2, S}, torch::kBool);
  valid[1].narrow(0, 0, pad).fill_(false);
  const auto positions = (valid.to(torch::kLong).cumsum(1) - 1).masked_fill(valid.logical_not(), 1);
  DecodeStep step;
  step.valid = valid.narrow(1, 0, prompt);
  step.positions = positions.narrow(1, 0, prompt);
  std::vector<LayerCache> caches;
  auto logits = m->decode(tokens.narrow(1, 0, prompt), step, caches);
  for (int64_t t = prompt;; ++t) {
    const int64_t i = t - prompt;
    EXPECT_LE((logits[0] - want0[i]).abs().max().item<double>(), 1e-5) << "row 0, slot " << t;
    EXPECT_LE((logits[1] - want1[i]).abs().max().item<double>(), 1e-5) << "row 1, slot " << t;
    if (t == S) return caches;
    step.past = t;
    step.valid = valid.narrow(1, 0, t + 1);
    step.positions = positions.narrow(1, t, 1);
    logits = m->decode(tokens.narrow(1, t, 1), step, caches);
  }
}

TEST(DecodeCache, GroupedQueryAttentionWithWindowsAndSinks) {
  expect_stepwise_equals_full(
      model_config({{"sliding_window", 4},
                    {"layer_types", {"sliding_attention", "full_attention"}},
                    {"attention_sinks", true},
                    {"qk_norm", true}}));
}

TEST(DecodeCache, LatentAttention) {
  expect_stepwise_equals_full(model_config({{"kv_lora_rank", 16},
                                            {"qk_nope_head_dim", 8},
                                            {"qk_rope_head_dim", 8},
                                            {"v_head_dim", 8},
                                            {"num_key_value_heads", 4}}));
}

// Latent attention caches, per layer and slot, the normalised latent and the rotated rotary key
// [B, 1, T, kvr + rope] (not H expanded keys and values), and its decode steps absorb kv_b_proj
// into the query and the output: still the full forward's logits, with a query bottleneck and
// LoRA adapters (kv_b_proj's folded into the absorbed weight) given a nonzero update.
TEST(DecodeCache, LatentAttentionCachesLatentsAndAbsorbsTheAdapters) {
  const int64_t kvr = 16, rope = 4;
  const auto cfg =
      model_config({{"kv_lora_rank", kvr},
                    {"q_lora_rank", 12},
                    {"qk_nope_head_dim", 8},
                    {"qk_rope_head_dim", rope},
                    {"v_head_dim", 6},
                    {"num_key_value_heads", 4}},
                   {{"lora",
                     {{"r", 4},
                      {"lora_alpha", 8},
                      {"target_modules",
                       {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}}}}});
  const auto caches = expect_stepwise_equals_full(cfg, [](TransformerLM& m) {
    int64_t updated = 0;
    for (auto& p : m->named_parameters()) {
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.2), ++updated;
    }
    ASSERT_EQ(updated, 2 * 5);  // 2 layers x 5 projections
  });
  ASSERT_EQ(caches.size(), 2u);
  for (const auto& c : caches) {
    ASSERT_TRUE(c.k.defined());
    EXPECT_EQ(c.k.sizes(), (std::vector<int64_t>{2, 1, 14, kvr + rope}));
    EXPECT_EQ(c.v.size(-1), 0);
  }
}

TEST(DecodeCache, GatedDeltaNetHybrid) {
  expect_stepwise_equals_full(
      model_config({{"num_layers", 3},
                    {"layer_types", {"linear_attention", "linear_attention", "full_attention"}},
                    {"head_dim", 8},
                    {"attention_output_gate", true},
                    {"linear_num_key_heads", 2},
                    {"linear_num_value_heads", 4},
                    {"linear_key_head_dim", 8},
                    {"linear_value_head_dim", 8}}));
}

}  // namespace
}  // namespace moe::model
