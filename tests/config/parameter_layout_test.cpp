// parameter_layout (src/config/parameter_layout.cpp) is the model's named_parameters() without
// building it: names, order and shapes, for every architecture switch and LoRA target.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/config/lora.h"
#include "moe/config/parameter_layout.h"
#include "moe/model/transformer.h"

namespace moe::model {
namespace {

config::Config make(nlohmann::json model, nlohmann::json moe, nlohmann::json lora) {
  nlohmann::json j = {{"train_batch_size", 2},
                      {"model",
                       {{"vocab_size", 40},
                        {"seq_len", 10},
                        {"hidden_size", 16},
                        {"num_layers", 3},
                        {"num_heads", 4}}},
                      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 12}}},
                      {"lora", lora},
                      {"data", {{"train_path", "unused.h5"}}}};
  j["model"].update(model);
  j["moe"].update(moe);
  config::Config c = config::from_json(j, "test.json");
  config::validate(c);
  return c;
}

void expect_layout_is_the_models(const config::Config& c) {
  TransformerLM m(c);
  const auto layout = config::parameter_layout(c);
  const auto params = m->named_parameters();
  ASSERT_EQ(layout.size(), params.size());
  size_t i = 0;
  for (const auto& item : params) {
    EXPECT_EQ(layout[i].name, item.key());
    EXPECT_EQ(layout[i].shape, item.value().sizes().vec()) << item.key();
    ++i;
  }
}

TEST(ParameterLayout, LearnedPositionsTiedHead) {
  expect_layout_is_the_models(make(nlohmann::json::object(), nlohmann::json::object(), {{"r", 0}}));
}

TEST(ParameterLayout, RotaryGqaQkNormDenseLayersSharedExpert) {
  expect_layout_is_the_models(make({{"rope_theta", 10000.0},
                                    {"num_key_value_heads", 2},
                                    {"qk_norm", true},
                                    {"tie_embeddings", false},
                                    {"dense_hidden_size", 20}},
                                   {{"mlp_only_layers", {1}}, {"shared_expert_hidden_size", 8}},
                                   {{"r", 0}}));
  expect_layout_is_the_models(
      make({{"rope_theta", 10000.0}, {"qk_norm", true}, {"qk_norm_scope", "full"}, {"head_dim", 8}},
           nlohmann::json::object(), {{"r", 0}}));
}

// gpt-oss: attention biases and sinks (a module's own parameter comes before its children's),
// router bias, expert biases; with LoRA on attention and experts.
// Qwen3-Next / Qwen3.5: Gated DeltaNet layers (both projection layouts), gated attention,
// zero-centred norms, a gated shared expert.
// With LoRA on attention, every Gated DeltaNet projection of the layout, the shared expert's gate
// and the experts: the adapters in the projections' order, and lora_parameter_counts agrees.
TEST(ParameterLayout, GatedDeltaNetHybrid) {
  for (bool fused : {false, true}) {
    const nlohmann::json model = {
        {"rope_theta", 10000.0},
        {"num_key_value_heads", 2},
        {"qk_norm", true},
        {"attention_output_gate", true},
        {"zero_centered_norm", true},
        {"layer_types", {"linear_attention", "linear_attention", "full_attention"}},
        {"linear_num_key_heads", 2},
        {"linear_num_value_heads", 4},
        {"linear_key_head_dim", 4},
        {"linear_value_head_dim", 6},
        {"linear_fused_projections", fused}};
    const nlohmann::json moe = {{"shared_expert_hidden_size", 8}, {"shared_expert_gate", true}};
    expect_layout_is_the_models(make(model, moe, {{"r", 0}}));
    nlohmann::json targets = {
        "q_proj", "v_proj", "o_proj", "out_proj", "up_proj", "gate_proj", "shared_expert_gate"};
    for (const char* name :
         fused ? std::vector<const char*>{"in_proj_qkvz", "in_proj_ba"}
               : std::vector<const char*>{"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}) {
      targets.push_back(name);
    }
    const config::Config lora = make(model, moe, {{"r", 2}, {"target_modules", targets}});
    expect_layout_is_the_models(lora);
    int64_t adapters = 0, linear = 0, shared_gate = 0;
    torch::manual_seed(0);
    TransformerLM m(lora);
    for (const auto& p : m->named_parameters()) {
      if (!config::is_lora_parameter(p.key())) continue;
      adapters += p.value().numel();
      linear += p.key().find(".linear_attn.lora_") != std::string::npos;
      shared_gate += p.key().find(".moe.lora_shared_expert_gate.") != std::string::npos;
    }
    EXPECT_EQ(config::lora_parameter_counts(lora).adapter, adapters);
    EXPECT_EQ(linear, 2 * 2 * (fused ? 3 : 5));  // A and B, 2 layers, each projection + out_proj
    EXPECT_EQ(shared_gate, 2 * 3);               // A and B in each of the 3 MoE layers
  }
}

// Gemma 4: a layer scalar (the block's own tensor, first), sandwich norms, the dense MLP beside
// the experts with its own norms (and a plain dense layer), the router's input and expert scales;
// the full-attention layer with its own head width and kv heads and no v projection (K = V),
// with and without LoRA; count_parameters and module_costs agree with the layout.
TEST(ParameterLayout, Gemma4ParallelDenseSandwichKeysAsValues) {
  const nlohmann::json model = {
      {"rope_theta", 10000.0},
      {"num_key_value_heads", 2},
      {"head_dim", 4},
      {"qk_norm", true},
      {"value_norm", true},
      {"attention_scale", 1.0},
      {"global_head_dim", 8},
      {"global_num_key_value_heads", 1},
      {"global_rope_theta", 1e6},
      {"global_partial_rotary_factor", 0.25},
      {"attention_k_eq_v", true},
      {"sliding_window", 4},
      {"layer_types", {"sliding_attention", "sliding_attention", "full_attention"}},
      {"sandwich_norms", true},
      {"layer_scalar", true},
      {"scale_embeddings", true},
      {"final_logit_softcapping", 30.0},
      {"dense_hidden_size", 20}};
  const nlohmann::json moe = {{"parallel_dense", true},
                              {"router_input_norm", true},
                              {"per_expert_scale", true},
                              {"activation", "geglu"},
                              {"mlp_only_layers", {1}}};
  const config::Config plain = make(model, moe, {{"r", 0}});
  expect_layout_is_the_models(plain);
  int64_t numel = 0;
  for (const auto& p : config::parameter_layout(plain)) {
    int64_t n = 1;
    for (const int64_t s : p.shape) n *= s;
    numel += n;
  }
  EXPECT_EQ(config::count_parameters(plain), numel);
  int64_t costed = 0;
  for (const auto& m : config::module_costs(plain)) costed += m.params * m.count;
  EXPECT_EQ(costed, numel);
  expect_layout_is_the_models(
      make(model, moe,
           {{"r", 2},
            {"target_modules",
             {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}}));
}

// Nemotron-H: one sublayer per block (Mamba-2 with conv bias, MoE, attention without positions,
// a dense MLP), relu2 MLPs and experts without gate; plain (count_parameters and module_costs
// agree with the layout), and with LoRA on attention, the Mamba projections and the experts
// (lora_parameter_counts agrees with the adapters); the Mamba projections' biases too.
TEST(ParameterLayout, NemotronHSublayerBlocksMambaRelu2) {
  const nlohmann::json model = {{"num_key_value_heads", 2},
                                {"no_position_encoding", true},
                                {"sublayer_blocks", true},
                                {"num_layers", 5},
                                {"layer_types", {"mamba", "moe", "full_attention", "mlp", "mamba"}},
                                {"mamba_num_heads", 4},
                                {"mamba_head_dim", 4},
                                {"ssm_state_size", 3},
                                {"mamba_n_groups", 2},
                                {"mamba_chunk_size", 4},
                                {"dense_hidden_size", 20}};
  const nlohmann::json moe = {
      {"activation", "relu2"}, {"shared_expert_hidden_size", 8}, {"score_function", "sigmoid"}};
  const config::Config plain = make(model, moe, {{"r", 0}});
  expect_layout_is_the_models(plain);
  const auto numel_of = [](const config::Config& c, bool adapters) {
    int64_t numel = 0;
    for (const auto& p : config::parameter_layout(c)) {
      if (config::is_lora_parameter(p.name) != adapters) continue;
      int64_t n = 1;
      for (const int64_t s : p.shape) n *= s;
      numel += n;
    }
    return numel;
  };
  EXPECT_EQ(config::count_parameters(plain), numel_of(plain, false));
  int64_t costed = 0;
  for (const auto& m : config::module_costs(plain)) costed += m.params * m.count;
  EXPECT_EQ(costed, numel_of(plain, false));
  const config::Config lora = make(
      model, moe,
      {{"r", 2},
       {"target_modules",
        {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "up_proj", "down_proj"}}});
  expect_layout_is_the_models(lora);
  EXPECT_EQ(config::lora_parameter_counts(lora).adapter, numel_of(lora, true));
  nlohmann::json biased = model;
  biased["mamba_proj_bias"] = true;
  biased["mamba_conv_bias"] = false;
  const config::Config with_biases = make(biased, moe, {{"r", 0}});
  expect_layout_is_the_models(with_biases);
  EXPECT_EQ(config::count_parameters(with_biases), numel_of(with_biases, false));
  // LatentMoE (Nemotron 3 Super): experts and their adapters at the latent width, plus the two
  // projections; the counts, the module costs and the adapters' count follow.
  nlohmann::json latent_moe = moe;
  latent_moe["latent_size"] = 6;
  const config::Config latent = make(model, latent_moe, {{"r", 0}});
  expect_layout_is_the_models(latent);
  EXPECT_EQ(config::count_parameters(latent), numel_of(latent, false));
  EXPECT_LT(config::count_parameters(latent), config::count_parameters(plain));
  costed = 0;
  for (const auto& m : config::module_costs(latent)) costed += m.params * m.count;
  EXPECT_EQ(costed, numel_of(latent, false));
  const config::Config latent_lora =
      make(model, latent_moe, {{"r", 2}, {"target_modules", {"in_proj", "up_proj", "down_proj"}}});
  expect_layout_is_the_models(latent_lora);
  EXPECT_EQ(config::lora_parameter_counts(latent_lora).adapter, numel_of(latent_lora, true));
}

TEST(ParameterLayout, GptOssBiasesSinksWindows) {
  const nlohmann::json model = {
      {"rope_theta", 150000.0},
      {"num_key_value_heads", 2},
      {"attention_bias", true},
      {"attention_sinks", true},
      {"sliding_window", 4},
      {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}};
  const nlohmann::json moe = {{"router_bias", true},
                              {"expert_bias", true},
                              {"softmax_after_topk", true},
                              {"activation", "clamped_swiglu"}};
  expect_layout_is_the_models(make(model, moe, {{"r", 0}}));
  expect_layout_is_the_models(
      make(model, moe,
           {{"r", 2}, {"target_modules", {"q_proj", "o_proj", "gate_up_proj", "down_proj"}}}));
}

TEST(ParameterLayout, EveryLoraTarget) {
  const nlohmann::json dense = {
      {"rope_theta", 10000.0}, {"num_key_value_heads", 2}, {"dense_hidden_size", 20}};
  expect_layout_is_the_models(make(dense, {{"mlp_only_layers", {0}}},
                                   {{"r", 4},
                                    {"target_modules",
                                     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj", "dense_mlp"}}}));
  expect_layout_is_the_models(make(dense, nlohmann::json::object(),
                                   {{"r", 2}, {"target_modules", {"v_proj", "gate_up_proj"}}}));
  expect_layout_is_the_models(
      make(dense, {{"shared_expert_hidden_size", 8}}, {{"r", 3}, {"target_modules", {"w2"}}}));
}

}  // namespace
}  // namespace moe::model
