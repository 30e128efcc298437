#include "moe/config/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moe/util/errors.h"

namespace moe::config {
namespace {

using nlohmann::json;

json minimal() {
  return json::parse(R"({
    "train_micro_batch_size_per_gpu": 4,
    "data": {"train_path": "x.h5"}
  })");
}

Config build(const json& j) {
  Config c = from_json(j, "test.json");
  validate(c);
  return c;
}

// Runs `fn` and returns the UserError message; fails the test if nothing was thrown.
template <class F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(Config, MinimalGetsDefaults) {
  Config c = build(minimal());
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.moe.num_experts, 8);
}

TEST(Config, BatchTripleInfersTheThird) {
  json j = minimal();
  j["train_batch_size"] = 32;
  Config c = build(j);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);

  j = minimal();
  j.erase("train_micro_batch_size_per_gpu");
  j["train_batch_size"] = 32;
  j["gradient_accumulation_steps"] = 4;
  EXPECT_EQ(build(j).train_micro_batch_size_per_gpu, 8);

  j = minimal();
  j["gradient_accumulation_steps"] = 3;
  EXPECT_EQ(build(j).train_batch_size, 12);
}

TEST(Config, BatchTripleInconsistentIsAnError) {
  json j = minimal();
  j["train_batch_size"] = 30;
  j["gradient_accumulation_steps"] = 4;
  std::string msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("train_batch_size = 30"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must equal"), std::string::npos) << msg;
}

TEST(Config, MissingBatchIsAnError) {
  json j = minimal();
  j.erase("train_micro_batch_size_per_gpu");
  EXPECT_NE(error_of([&] { build(j); }).find("train_batch_size"), std::string::npos);
}

TEST(Config, UnknownKeySuggestsNearKey) {
  json j = minimal();
  j["optimizer"] = {{"params", {{"lrr", 0.1}}}};
  std::string msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("unknown key 'optimizer.params.lrr'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'optimizer.params.lr'"), std::string::npos) << msg;

  j = minimal();
  j["train_batch_sise"] = 4;
  msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("did you mean 'train_batch_size'"), std::string::npos) << msg;
}

TEST(Config, SeedGuideKeysPointToOurNames) {
  json j = minimal();
  j["learning_rate"] = 1e-4;
  EXPECT_NE(error_of([&] { build(j); }).find("did you mean 'optimizer.params.lr'"),
            std::string::npos);
  j = minimal();
  j["expert_dropout"] = 0.1;
  EXPECT_NE(error_of([&] { build(j); }).find("did you mean 'moe.expert_dropout'"),
            std::string::npos);
}

TEST(Config, UnknownKeyWithoutNearKey) {
  json j = minimal();
  j["completely_unrelated"] = 1;
  std::string msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("unknown key 'completely_unrelated'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST(Config, WrongTypesNameThePath) {
  json j = minimal();
  j["model"] = {{"hidden_size", "big"}};
  std::string msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("model.hidden_size = \"big\": expected an integer"), std::string::npos) << msg;

  j = minimal();
  j["bf16"] = {{"enabled", 1}};
  EXPECT_NE(error_of([&] { build(j); }).find("bf16.enabled = 1: expected true or false"),
            std::string::npos);

  j = minimal();
  j["optimizer"] = {{"params", {{"betas", {0.9}}}}};
  EXPECT_NE(error_of([&] { build(j); }).find("expected an array of two numbers"),
            std::string::npos);
  j = minimal();
  j["model"] = 5;
  EXPECT_NE(error_of([&] { build(j); }).find("model = 5: expected a JSON object"),
            std::string::npos);
}

TEST(Config, RangeRulesNameValueAndRule) {
  json j = minimal();
  j["optimizer"] = {{"params", {{"lr", -0.001}}}};
  std::string msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("optimizer.params.lr = -0.001: must be > 0"), std::string::npos) << msg;

  j = minimal();
  j["moe"] = {{"num_experts", 4}, {"top_k", 5}};
  msg = error_of([&] { build(j); });
  EXPECT_NE(msg.find("moe.top_k = 5: must be <= moe.num_experts (4)"), std::string::npos) << msg;

  j = minimal();
  j["model"] = {{"hidden_size", 100}, {"num_heads", 3}};
  EXPECT_NE(error_of([&] { build(j); }).find("must divide model.hidden_size"), std::string::npos);

  j = minimal();
  j["fp16"] = {{"enabled", true}};
  j["bf16"] = {{"enabled", true}};
  EXPECT_NE(error_of([&] { build(j); }).find("cannot both be enabled"), std::string::npos);

  j = minimal();
  j["scheduler"] = {{"type", "Cosine"}};
  EXPECT_NE(error_of([&] { build(j); }).find("expected one of WarmupLR"), std::string::npos);

  j = minimal();
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"cos_min_ratio", 0.1}}}};
  EXPECT_NE(error_of([&] { build(j); }).find("unknown key 'scheduler.params.cos_min_ratio'"),
            std::string::npos);
}

TEST(Config, HugeIntegerIsRejected) {
  json j = minimal();
  j["steps_per_print"] = 18446744073709551615ULL;
  EXPECT_NE(error_of([&] { build(j); }).find("expected an integer below 2^63"), std::string::npos);
}

TEST(Config, IntegralFloatsAreAcceptedAsIntegers) {
  json j = minimal();
  j["training"] = {{"train_iters", 1e3}};
  EXPECT_EQ(build(j).training.train_iters, 1000);
  j["training"] = {{"train_iters", 1.5}};
  EXPECT_NE(error_of([&] { build(j); }).find("expected an integer"), std::string::npos);
}

TEST(Config, SyntaxErrorReportsLineAndColumn) {
  std::string text = "{\n  \"a\": 1,\n  \"b\": tru\n}\n";
  std::string msg = error_of([&] { parse_json_text(text, "bad.json"); });
  EXPECT_NE(msg.find("bad.json:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
}

TEST(Config, OverridesAreTypedAndCreatePaths) {
  json j = minimal();
  apply_override(j, "optimizer.params.lr=3e-4");
  apply_override(j, "training.output_dir=/tmp/run one");
  apply_override(j, "bf16.enabled=true");
  Config c = build(j);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.training.output_dir, "/tmp/run one");
  EXPECT_TRUE(c.bf16.enabled);

  apply_override(j, "model.num_layers=many");
  EXPECT_NE(error_of([&] { build(j); }).find("model.num_layers = \"many\": expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(j, "novalue"); }).find("expected dotted.key=value"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(j, "model.num_layers.x=1"); }).find("not an object"),
            std::string::npos);
}

TEST(Config, ResolvedJsonRoundTrips) {
  json j = minimal();
  j["scheduler"] = {{"type", "WarmupDecayLR"},
                    {"params", {{"total_num_steps", 100}, {"warmup_num_steps", 10}}}};
  Config c = build(j);
  json out = to_json(c);
  Config again = build(out);
  EXPECT_EQ(to_json(again), out);
  EXPECT_EQ(out["moe"]["expert_hidden_size"], expert_hidden_size(c));
}

TEST(Config, ParameterCountOfTheSeedSizedModel) {
  json j = minimal();
  j["model"] = {{"hidden_size", 4096},
                {"num_layers", 10},
                {"num_heads", 32},
                {"vocab_size", 32000},
                {"seq_len", 2048}};
  j["moe"] = {{"num_experts", 16}, {"top_k", 2}, {"expert_hidden_size", 2048}};
  Config c = build(j);
  // 10 * (4*4096^2 + 2*4096 + 4096*16 + 16*3*4096*2048) + 32000*4096 + 2048*4096 + 4096
  EXPECT_EQ(count_parameters(c), 4'837'822'464);
}

}  // namespace
}  // namespace moe::config
