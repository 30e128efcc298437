#include "moe/config/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_test_util.h"
#include "moe/config/lora.h"
#include "moe/util/errors.h"

namespace moe::config {
namespace {

using nlohmann::json;

using test_util::build;
using test_util::minimal;

// Runs `fn` and returns the UserError message; fails the test if nothing was thrown.
template <class F>
std::string error_of(F fn) {
  std::string message = test_util::user_error(fn);
  if (message.empty()) ADD_FAILURE() << "expected a UserError";
  return message;
}

TEST(Config, MinimalGetsDefaults) {
  Config c = build(minimal());
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupCosineLR);
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

// DeepSpeed refuses a batch size of 0; here 0 once trained 400 steps (0 meant "derive it").
TEST(Config, ExplicitZeroBatchSizesAreErrors) {
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    json j = minimal();
    j[key] = 0;
    EXPECT_EQ(error_of([&] { build(j); }),
              std::string("config: test.json: ") + key + " = 0: must be > 0");
  }
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

TEST(Config, ClosedSetsReadAsEnumsAndWriteAsNames) {
  json j = minimal();
  j["optimizer"] = {{"type", "Adam"}};
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_type", "linear"}}}};
  j["zero_optimization"] = {{"offload_optimizer", {{"device", "cpu"}}}};
  j["moe"] = {{"score_function", "sigmoid"}};
  j["training"] = {{"device", "cpu"}};
  j["checkpoint"] = {{"on_failure", "continue"}};
  Config c = build(j);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.moe.score_function, ScoreFunction::kSigmoid);
  EXPECT_EQ(c.training.device, TrainingDevice::kCpu);
  EXPECT_EQ(c.checkpoint.on_failure, OnFailure::kContinue);
  json out = to_json(c);
  EXPECT_EQ(out["optimizer"]["type"], "Adam");
  EXPECT_EQ(out["scheduler"]["params"]["warmup_type"], "linear");
  EXPECT_EQ(out["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(out["moe"]["score_function"], "sigmoid");
  EXPECT_EQ(out["training"]["device"], "cpu");
  EXPECT_EQ(out["checkpoint"]["on_failure"], "continue");
  // A LinearWarmupCosineDecay warmup is linear; it takes no warmup_type.
  j["scheduler"] = {{"type", "LinearWarmupCosineDecay"}};
  EXPECT_EQ(build(j).scheduler.warmup_type, WarmupType::kLinear);
}

TEST(Config, NamesOutsideAClosedSetListTheNames) {
  json j = minimal();
  j["training"] = {{"device", "gpu"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: training.device = \"gpu\": expected one of auto, cpu, cuda");
  j = minimal();
  j["optimizer"] = {{"type", "SGD"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: optimizer.type = \"SGD\": expected one of AdamW, Adam");
  j = minimal();
  j["scheduler"] = {{"type", "Cosine"}};
  EXPECT_EQ(
      error_of([&] { build(j); }),
      "config: test.json: scheduler.type = \"Cosine\": expected one of WarmupLR, WarmupDecayLR, "
      "WarmupCosineLR, LinearWarmupCosineDecay, Constant");
  j = minimal();
  j["moe"] = {{"kernels", "triton"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.kernels = \"triton\": expected one of auto, cuda, reference");
  EXPECT_EQ(error_of([&] { parse_choice<TrainingDevice>("tpu", "training.device", "s.json"); }),
            "config: s.json: training.device = \"tpu\": expected one of auto, cpu, cuda");
  j = minimal();
  j["training"] = {{"device", 1}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: training.device = 1: expected a string");
}

TEST(Config, MultiGpuKeysWarn) {
  json j = minimal();
  j["zero_optimization"] = {{"stage", 1}, {"reduce_scatter", true}, {"overlap_comm", true}};
  j["prescale_gradients"] = true;
  EXPECT_EQ(build(j).warnings,
            (std::vector<std::string>{
                "zero_optimization.reduce_scatter is a multi-GPU setting; ignored",
                "prescale_gradients is a multi-GPU setting; ignored",
                "zero_optimization.stage = 1: ZeRO partitions state across GPUs; with one GPU it "
                "changes nothing"}));
}

// DeepSpeed's activation-checkpointing switches are read; asking for one says it does nothing.
TEST(Config, InertCheckpointingSwitchesWarnWhenTrue) {
  json j = minimal();
  j["activation_checkpointing"] = {{"cpu_checkpointing", false}, {"profile", false}};
  EXPECT_TRUE(build(j).warnings.empty());
  j["activation_checkpointing"]["partition_activations"] = true;
  const auto w = build(j).warnings;
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("activation_checkpointing.partition_activations = true has no effect", 0),
            0u)
      << w[0];
  // cpu_checkpointing does something (checkpoints in host memory): no warning.
  j["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  EXPECT_TRUE(build(j).warnings.empty());
  EXPECT_TRUE(build(j).activation_checkpointing.cpu_checkpointing);
}

// training.param_dtype / optimizer.main_params_dtype: what each needs, named in one line.
TEST(Config, SixteenBitWeightRules) {
  json j = minimal();
  j["training"]["param_dtype"] = "bf16";
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: training.param_dtype = bf16: needs bf16.enabled = true");
  j["bf16"] = {{"enabled", true}};
  EXPECT_EQ(build(j).training.param_dtype, ParamDtype::kBf16);
  j["optimizer"] = {{"main_params_dtype", "bf16"}};
  EXPECT_EQ(build(j).optimizer.main_params_dtype, ParamDtype::kBf16);
  j["zero_optimization"] = {{"offload_optimizer", {{"device", "cpu"}}}};
  EXPECT_NE(error_of([&] {
              build(j);
            }).find("optimizer.main_params_dtype = bf16: offload keeps an fp32 master"),
            std::string::npos);
  j = minimal();
  j["optimizer"] = {{"main_params_dtype", "bf16"}};
  EXPECT_NE(error_of([&] { build(j); }).find("needs training.param_dtype = bf16"),
            std::string::npos);
  j["optimizer"] = {{"main_params_dtype", "fp16"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: optimizer.main_params_dtype = fp16: expected fp32 or bf16");
  j = minimal();
  j["fp16"] = {{"enabled", true}};
  j["training"]["param_dtype"] = "bf16";
  EXPECT_NE(error_of([&] { build(j); }).find("needs bf16.enabled = true"), std::string::npos);
  j["training"]["param_dtype"] = "fp16";
  EXPECT_EQ(build(j).training.param_dtype, ParamDtype::kFp16);
  j["lora"] = {{"r", 8}, {"target_modules", {"q_proj"}}};
  EXPECT_NE(error_of([&] { build(j); }).find("training.param_dtype = fp16: LoRA keeps"),
            std::string::npos);
}

TEST(Config, RulesWithNotesAndEmptyStrings) {
  json j = minimal();
  j["moe"] = {{"router_bias_update_rate", 1}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.router_bias_update_rate = 1: must be in [0, 1) (0 = no expert "
            "bias)");
  j = minimal();
  j["model"] = {{"vocab_size", 1}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.vocab_size = 1: must be in [2, 2^31]");
  j = minimal();
  j["optimizer"] = {{"params", {{"betas", {0.9, 1.0}}}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: optimizer.params.betas[1] = 1: must be in [0, 1)");
  j = minimal();
  j["monitor"] = {{"prometheus", {{"host", ""}}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: monitor.prometheus.host = \"\": must name an address to bind, e.g. "
            "127.0.0.1");
}

TEST(Config, ResolvedJsonWritesOnlyTheSchedulersParams) {
  json j = minimal();
  j["scheduler"] = {{"type", "Constant"}};
  EXPECT_EQ(to_json(build(j))["scheduler"]["params"], json::object());
  j["scheduler"] = {{"type", "WarmupLR"}};
  json params = to_json(build(j))["scheduler"]["params"];
  EXPECT_EQ(params.size(), 4u) << params;
  EXPECT_FALSE(params.contains("cos_min_ratio")) << params;
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

// Dense/MoE layer layout keys (Qwen3-MoE's names) and the q/k norm scope.
TEST(Config, LayerLayoutKeysAreChecked) {
  json j = minimal();
  j["model"] = {{"num_layers", 4}};
  j["moe"] = {{"mlp_only_layers", {1, 4}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.mlp_only_layers[1] = 4: must be a layer index < "
            "model.num_layers (4)");
  j["moe"] = {{"mlp_only_layers", {1, -1}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.mlp_only_layers[1] = -1: must be >= 0");
  j["moe"] = {{"mlp_only_layers", "1"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.mlp_only_layers = \"1\": expected an array of integers");
  j["moe"] = {{"decoder_sparse_step", 5}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.decoder_sparse_step = 5: leaves no MoE layer (with "
            "moe.mlp_only_layers)");
  j["moe"] = {{"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}};
  const Config c = build(j);
  EXPECT_EQ(moe_layer_count(c), 1);
  EXPECT_EQ(to_json(c)["moe"]["mlp_only_layers"], json({3}));
  j = minimal();
  j["model"] = {{"qk_norm_scope", "full"}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.qk_norm_scope = \"full\": needs model.qk_norm = true");
  j["model"] = {{"qk_norm_scope", "all"}, {"qk_norm", true}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.qk_norm_scope = \"all\": expected one of head, full");
}

// Group-limited routing: each rule names its key.
TEST(Config, ExpertGroupKeysAreChecked) {
  json j = minimal();
  auto moe = [&](json m) {
    m["num_experts"] = 16;
    m["score_function"] = "sigmoid";
    j["moe"] = m;
    return error_of([&] { build(j); });
  };
  EXPECT_EQ(moe({{"n_group", 3}}),
            "config: test.json: moe.n_group = 3: must divide moe.num_experts (16)");
  EXPECT_EQ(moe({{"n_group", 4}, {"topk_group", 5}}),
            "config: test.json: moe.topk_group = 5: must be <= moe.n_group (4)");
  EXPECT_EQ(moe({{"n_group", 16}}),
            "config: test.json: moe.n_group = 16: leaves 1 experts per group; a group's score is "
            "the sum of its best 2 (moe.group_score_experts)");
  EXPECT_EQ(moe({{"n_group", 4}, {"topk_group", 1}, {"top_k", 5}}),
            "config: test.json: moe.top_k = 5: must be <= moe.topk_group x experts per group (4)");
  // DeepSeek-V2's group_limited_greedy: softmax scores, a group scored by its best expert.
  j["moe"] = {{"num_experts", 16}, {"n_group", 16}, {"topk_group", 2}, {"group_score_experts", 1}};
  EXPECT_EQ(build(j).moe.group_score_experts, 1);
  j["moe"] = {{"num_experts", 16}, {"n_group", 4}, {"group_score_experts", 0}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: moe.group_score_experts = 0: must be >= 1");
  EXPECT_EQ(moe({{"routed_scaling_factor", 0}}),
            "config: test.json: moe.routed_scaling_factor = 0: must be > 0");
  j["moe"] = {{"num_experts", 16}, {"score_function", "sigmoid"}, {"n_group", 4}, {"topk_group", 2},
              {"top_k", 4},        {"routed_scaling_factor", 2.5}};
  const Config c = build(j);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_EQ(to_json(c)["moe"]["routed_scaling_factor"], 2.5);
}

// Multi-head latent attention: its keys, and what it cannot combine with, each naming its key.
TEST(Config, LatentAttentionKeysAreChecked) {
  json j = minimal();
  auto model = [&](json m) {
    m["rope_theta"] = 10000;
    j["model"] = m;
    return error_of([&] { build(j); });
  };
  const json mla = {
      {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8}};
  j["model"] = mla;
  j["model"]["rope_theta"] = 10000;
  const Config c = build(j);
  EXPECT_TRUE(latent_attention(c));
  EXPECT_EQ(qk_head_dim(c), 12);
  EXPECT_EQ(value_head_dim(c), 8);
  EXPECT_EQ(model({{"q_lora_rank", 8}}),
            "config: test.json: model.q_lora_rank = 8: needs model.kv_lora_rank > 0 (multi-head "
            "latent attention)");
  json odd = mla;
  odd["qk_rope_head_dim"] = 3;
  EXPECT_EQ(model(odd),
            "config: test.json: model.qk_rope_head_dim = 3: must be even and >= 2 with "
            "multi-head latent attention (model.kv_lora_rank > 0)");
  json gqa = mla;
  gqa["num_key_value_heads"] = 2;
  EXPECT_EQ(model(gqa),
            "config: test.json: model.num_key_value_heads = 2: must be 0 or model.num_heads with "
            "multi-head latent attention (model.kv_lora_rank > 0): every head has its own keys "
            "and values");
  json norms = mla;
  norms["qk_norm"] = true;
  EXPECT_EQ(model(norms),
            "config: test.json: model.qk_norm = true: is not supported with multi-head latent "
            "attention (model.kv_lora_rank > 0)");
  j["model"] = mla;
  j["model"]["rope_theta"] = 0;
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.kv_lora_rank = 16: needs rotary positions (model.rope_theta "
            "> 0) with multi-head latent attention (model.kv_lora_rank > 0)");
  // LoRA targets that only the other attention form has.
  j["model"] = mla;
  j["model"]["rope_theta"] = 10000;
  j["lora"] = {{"r", 4}, {"target_modules", {"k_proj"}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: lora.target_modules = \"k_proj\": latent attention "
            "(model.kv_lora_rank > 0) has no k_proj / v_proj: its keys and values come from "
            "kv_a_proj_with_mqa and kv_b_proj");
  j["lora"] = {{"r", 4}, {"target_modules", {"kv_b_proj", "q_proj", "o_proj"}}};
  EXPECT_TRUE(lora_targets(build(j).lora).kv_b);
}

// model.rope_scaling: a nested section read, checked and written like the others.
TEST(Config, RopeScalingIsCheckedAndWrittenBack) {
  json j = minimal();
  j["model"] = {{"rope_scaling", {{"type", "yarn"}, {"factor", 4}}}};
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.rope_scaling.type = \"yarn\": scales rotary positions; "
            "model.rope_theta is 0 (learned positions)");
  j["model"]["rope_theta"] = 1e6;
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.rope_scaling.original_max_position_embeddings = 0: must be "
            "the pretraining window (> 0) with yarn scaling");
  j["model"]["rope_scaling"]["original_max_position_embeddings"] = 4096;
  j["model"]["rope_scaling"]["beta_slow"] = 40;
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.rope_scaling.beta_fast = 32: must be >= "
            "model.rope_scaling.beta_slow (40)");
  j["model"]["rope_scaling"].erase("beta_slow");
  j["model"]["rope_scaling"]["factor"] = 0.5;
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.rope_scaling.factor = 0.5: must be >= 1");
  j["model"]["rope_scaling"]["factor"] = 4;
  j["model"]["rope_scaling"]["type"] = "dynamic";
  EXPECT_EQ(error_of([&] { build(j); }),
            "config: test.json: model.rope_scaling.type = \"dynamic\": expected one of none, "
            "linear, yarn");
  j["model"]["rope_scaling"]["type"] = "yarn";
  const Config c = build(j);
  EXPECT_EQ(c.model.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(c.model.rope_scaling.original_max_position_embeddings, 4096);
  const json written = to_json(c)["model"]["rope_scaling"];
  EXPECT_EQ(written["type"], "yarn");
  EXPECT_EQ(written["beta_fast"], 32.0);
  EXPECT_EQ(build(json::parse(to_json(c).dump())).model.rope_scaling, c.model.rope_scaling);
}

// A downloaded config.json nested a million levels deep (fuzzing found it): refused before the
// parse, since printing or copying such a value recurses once per level.
TEST(Config, DeeplyNestedJsonIsRefusedNamingTheFile) {
  const std::string deep = "{\"a\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  EXPECT_EQ(error_of([&] { parse_json_text(deep, "config.json", "hf"); }),
            "hf: config.json: arrays and objects nested more than 512 levels deep (the parser's "
            "limit) (moe-train --limit json.nesting=N raises it)");
  // Brackets inside strings do not count; real files nest a few levels.
  const std::string in_string = "{\"a\": \"" + std::string(2000, '[') + "\"}";
  EXPECT_EQ(parse_json_text(in_string, "config.json", "hf")["a"].get<std::string>().size(), 2000u);
}

TEST(Config, GlmAttentionKeysAreChecked) {
  json j = minimal();
  auto model = [&](json m) {
    j["model"] = m;
    return error_of([&] { build(j); });
  };
  // head_dim 64 (256 / 4): 0.5 gives 32 rotary dimensions; 0.3 gives int(19.2) = 19, odd.
  EXPECT_EQ(model({{"rope_theta", 1e4}, {"partial_rotary_factor", 0.3}}),
            "config: test.json: model.partial_rotary_factor = 0.3: head_dim (64) x factor must "
            "give an even number of rotary dimensions >= 2");
  EXPECT_NE(
      model({{"rope_theta", 1e4}, {"partial_rotary_factor", 0}}).find("partial_rotary_factor"),
      std::string::npos);
  EXPECT_NE(
      model({{"rope_theta", 1e4}, {"partial_rotary_factor", 1.5}}).find("partial_rotary_factor"),
      std::string::npos);
  EXPECT_EQ(model({{"partial_rotary_factor", 0.5}}),
            "config: test.json: model.partial_rotary_factor = 0.5: needs rotary positions "
            "(model.rope_theta > 0)");
  EXPECT_EQ(model({{"qkv_bias", true}, {"attention_bias", true}}),
            "config: test.json: model.qkv_bias = true: cannot be combined with "
            "model.attention_bias (which already biases q, k, v and o)");
  j = minimal();
  j["model"]["rope_theta"] = 1e4;
  j["model"]["partial_rotary_factor"] = 0.5;
  j["model"]["qkv_bias"] = true;
  const Config c = build(j);
  EXPECT_EQ(c.model.partial_rotary_factor, 0.5);
  EXPECT_TRUE(c.model.qkv_bias);
  EXPECT_EQ(to_json(c)["model"]["partial_rotary_factor"], 0.5);
}

}  // namespace
}  // namespace moe::config
