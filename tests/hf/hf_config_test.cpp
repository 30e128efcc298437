#include "moe/hf/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "moe/util/errors.h"

// The rotary settings of config.json read as transformers 5.24 reads them, and written so that
// transformers 4.x and 5.x both load what was trained (transformers itself is the oracle in
// tests/hf/hf_rope_scaling_test.py; these pin the rules without Python).
namespace moe::hf {
namespace {

using nlohmann::json;

const families::ModelFamily& mixtral_family() { return families::family_named("mixtral", "test"); }

json mixtral(const json& rope) {
  json c = {{"architectures", {"MixtralForCausalLM"}},
            {"vocab_size", 320},
            {"hidden_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"num_local_experts", 4},
            {"num_experts_per_tok", 2},
            {"intermediate_size", 48},
            {"max_position_embeddings", 64},
            {"rope_theta", 1e6}};
  c.update(rope);
  return c;
}

json imported_scaling(const json& hf) {
  return architecture_from_hf(hf, "config.json", nullptr, nullptr)["model"].value("rope_scaling",
                                                                                  json());
}

std::string import_error(const json& hf) {
  try {
    architecture_from_hf(hf, "config.json", nullptr, nullptr);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError for " << hf.dump();
  return "";
}

TEST(HfRope, NullFactorIsTheRatioOfTheWindowsAndNullTruncateIsFalse) {
  const json s = imported_scaling(mixtral({{"rope_parameters",
                                            {{"rope_type", "yarn"},
                                             {"factor", nullptr},
                                             {"original_max_position_embeddings", 8},
                                             {"truncate", nullptr}}}}));
  EXPECT_EQ(s["type"], "yarn");
  EXPECT_EQ(s["factor"], 8.0);  // 64 / 8
  EXPECT_EQ(s["truncate"], false);
  EXPECT_EQ(s["beta_fast"], 32.0);
  EXPECT_EQ(s["beta_slow"], 1.0);
}

TEST(HfRope, LegacyRopeScalingWinsAndTopLevelOriginalWindowWins) {
  json hf =
      mixtral({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}},
               {"rope_scaling",
                {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}}},
               {"original_max_position_embeddings", 32}});
  const json s = imported_scaling(hf);
  EXPECT_EQ(s["type"], "yarn");
  EXPECT_EQ(s["original_max_position_embeddings"], 32);
  EXPECT_EQ(s["truncate"], true);
}

TEST(HfRope, RefusalsNameTheField) {
  const json yarn = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 16}};
  EXPECT_EQ(import_error(mixtral({{"rope_parameters", yarn}})),
            "hf: config.json: rope_parameters.factor: missing (yarn needs a number >= 1, or null "
            "for max_position_embeddings / original_max_position_embeddings)");
  json reversed = yarn;
  reversed.update({{"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 8.0}});
  EXPECT_EQ(import_error(mixtral({{"rope_scaling", reversed}})),
            "hf: config.json: rope_scaling.beta_fast = 1.0: must be >= beta_slow (the ramp runs "
            "from beta_fast rotations down to beta_slow)");
  json truncate = yarn;
  truncate.update({{"factor", 4.0}, {"truncate", "no"}});
  EXPECT_EQ(import_error(mixtral({{"rope_parameters", truncate}})),
            "hf: config.json: rope_parameters.truncate = \"no\": expected true, false or null");
  EXPECT_EQ(import_error(mixtral({{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2}}}})),
            "hf: config.json: rope_parameters.rope_type = \"dynamic\": not supported (default, "
            "linear and yarn are)");
  EXPECT_EQ(
      import_error(mixtral({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 0.5}}}})),
      "hf: config.json: rope_parameters.factor = 0.5: linear scaling needs a factor >= 1");
}

TEST(HfRope, PretrainingWindowRules) {
  const json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}};
  // Neither window: the error names what would supply one.
  json no_max = mixtral({{"rope_parameters", yarn}});
  no_max.erase("max_position_embeddings");
  EXPECT_EQ(import_error(no_max),
            "hf: config.json: rope_parameters.original_max_position_embeddings: missing: yarn "
            "needs the pretraining window (rope_parameters.original_max_position_embeddings, or "
            "a positive max_position_embeddings)");
  // Absent from the dict: max_position_embeddings is the window (transformers' setdefault).
  EXPECT_EQ(
      imported_scaling(mixtral({{"rope_parameters", yarn}}))["original_max_position_embeddings"],
      64);
  // null in the dict stays null for transformers (a TypeError there): refused.
  json null_window = yarn;
  null_window["original_max_position_embeddings"] = nullptr;
  EXPECT_EQ(import_error(mixtral({{"rope_parameters", null_window}})),
            "hf: config.json: rope_parameters.original_max_position_embeddings = null: expected "
            "a positive integer (yarn's pretraining window)");
  // A top-level null overrides the dict's window as any top-level value does: refused too.
  json dict_window = yarn;
  dict_window["original_max_position_embeddings"] = 16;
  EXPECT_EQ(import_error(mixtral(
                {{"rope_parameters", dict_window}, {"original_max_position_embeddings", nullptr}})),
            "hf: config.json: original_max_position_embeddings = null: expected a positive "
            "integer (yarn's pretraining window; it overrides "
            "rope_parameters.original_max_position_embeddings)");
  // factor null with no max_position_embeddings: nothing to take the ratio of.
  json null_factor = dict_window;
  null_factor["factor"] = nullptr;
  json no_max2 = mixtral({{"rope_parameters", null_factor}});
  no_max2.erase("max_position_embeddings");
  EXPECT_EQ(import_error(no_max2),
            "hf: config.json: max_position_embeddings: missing: rope_parameters.factor = null "
            "takes the factor from max_position_embeddings / original_max_position_embeddings");
}

TEST(HfRope, FalsyRopeScalingIsAbsentAndTopLevelPartialRotaryFactorCounts) {
  const json linear = {{"rope_type", "linear"}, {"factor", 2.0}};
  for (const json& falsy : {json(false), json(0), json(""), json::object(), json(nullptr)}) {
    EXPECT_EQ(
        imported_scaling(mixtral({{"rope_parameters", linear}, {"rope_scaling", falsy}}))["type"],
        "linear")
        << falsy.dump();
  }
  EXPECT_EQ(import_error(mixtral({{"partial_rotary_factor", 0.5}})),
            "hf: config.json: partial_rotary_factor = 0.5: only 1 is supported (every dimension "
            "of the head rotates)");
  // The dict's own value comes first (transformers' setdefault); null there fails in transformers.
  json full = linear;
  full["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(imported_scaling(
                mixtral({{"rope_parameters", full}, {"partial_rotary_factor", 0.5}}))["type"],
            "linear");
  full["partial_rotary_factor"] = nullptr;
  EXPECT_EQ(import_error(mixtral({{"rope_parameters", full}})),
            "hf: config.json: rope_parameters.partial_rotary_factor = null: expected a number "
            "(transformers fails on null)");
}

config::Config trained_with(const json& rope_scaling) {
  json root = {{"train_micro_batch_size_per_gpu", 1}, {"data", {{"train_path", "x.h5"}}}};
  root.update(architecture_from_hf(mixtral(json::object()), "config.json", nullptr, nullptr));
  root["model"]["rope_scaling"] = rope_scaling;
  return config::from_json(root, "run.json");
}

TEST(HfRope, YarnExportSetsTheScaledWindowAndALegacyCopyFor4x) {
  const json base = mixtral({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
                             {"original_max_position_embeddings", 99}});
  const json yarn = {{"type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 16}};
  const json out = hf_config_from(trained_with(yarn), mixtral_family(), base, "float32");
  EXPECT_EQ(out["max_position_embeddings"], 128);  // 8 x 16, past the base's 64
  EXPECT_FALSE(out.contains("original_max_position_embeddings"));
  const json& p = out["rope_parameters"];
  EXPECT_EQ(p["rope_type"], "yarn");
  EXPECT_EQ(p["rope_theta"], 1e6);
  EXPECT_EQ(p["truncate"], true);
  json legacy = p;
  legacy.erase("rope_theta");  // 4.x warns about keys its rope_scaling does not know
  legacy.erase("truncate");    // the default; unknown to 4.x releases before it
  EXPECT_EQ(out["rope_scaling"], legacy);
  EXPECT_EQ(out["rope_theta"], 1e6);
  // Read back: the same scaling.
  EXPECT_EQ(rope_scaling_of(out, "out.json"), trained_with(yarn).model.rope_scaling);

  json untruncated = yarn;
  untruncated["truncate"] = false;
  const json out2 = hf_config_from(trained_with(untruncated), mixtral_family(), base, "float32");
  EXPECT_EQ(out2["rope_scaling"]["truncate"], false);
  EXPECT_EQ(rope_scaling_of(out2, "out.json"), trained_with(untruncated).model.rope_scaling);

  const json plain =
      hf_config_from(trained_with({{"type", "none"}}), mixtral_family(), base, "float32");
  EXPECT_FALSE(plain.contains("rope_scaling"));  // the base's linear scaling is not carried over
  EXPECT_EQ(plain["rope_parameters"]["rope_type"], "default");
  EXPECT_EQ(plain["max_position_embeddings"], 64);
}

TEST(HfRope, YarnExportWarnsOfAFractionalOrLoweredWindow) {
  const json base = mixtral(json::object());  // max_position_embeddings 64
  std::vector<std::string> warnings;
  const json whole = {{"type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 16}};
  hf_config_from(trained_with(whole), mixtral_family(), base, "float32", &warnings);
  EXPECT_TRUE(warnings.empty());

  const json fractional = {
      {"type", "yarn"}, {"factor", 4.1}, {"original_max_position_embeddings", 16}};
  const json out =
      hf_config_from(trained_with(fractional), mixtral_family(), base, "float32", &warnings);
  EXPECT_EQ(out["max_position_embeddings"], 66);  // llround(65.6)
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("= 65.6 is not a whole number"), std::string::npos) << warnings[0];

  warnings.clear();
  const json lowered = {
      {"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 16}};
  EXPECT_EQ(hf_config_from(trained_with(lowered), mixtral_family(), base, "float32",
                           &warnings)["max_position_embeddings"],
            32);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("lowered from the base's 64 to 32"), std::string::npos) << warnings[0];
}

// DeepSeek-V2 / V3 (latent attention): the config classes' defaults where config.json is silent,
// V2's router rules, and refusals that name the key.
json deepseek(const std::string& arch, const json& extra) {
  json c = {{"architectures", {arch}},
            {"vocab_size", 320},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"moe_intermediate_size", 32},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 4},
            {"n_routed_experts", 8},
            {"num_experts_per_tok", 2},
            {"kv_lora_rank", 16},
            {"qk_rope_head_dim", 8},
            {"qk_nope_head_dim", 16},
            {"v_head_dim", 12},
            {"max_position_embeddings", 64}};
  c.update(extra);
  return c;
}

TEST(HfDeepseek, V3DefaultsAndYarnMscale) {
  const families::ModelFamily* f = nullptr;
  const json a = architecture_from_hf(
      deepseek("DeepseekV3ForCausalLM", {{"q_lora_rank", 24},
                                         {"n_group", 4},
                                         {"topk_group", 2},
                                         {"rope_scaling",
                                          {{"type", "yarn"},
                                           {"factor", 40},
                                           {"mscale", 1.0},
                                           {"mscale_all_dim", 1.0},
                                           {"original_max_position_embeddings", 4}}}}),
      "config.json", &f, nullptr);
  ASSERT_NE(f, nullptr);
  EXPECT_STREQ(f->model_type(), "deepseek_v3");
  const json& m = a["model"];
  const json& e = a["moe"];
  EXPECT_EQ(m["kv_lora_rank"], 16);
  EXPECT_EQ(m["q_lora_rank"], 24);
  EXPECT_EQ(m["head_dim"], 0);
  EXPECT_EQ(m["num_key_value_heads"], 0);
  EXPECT_EQ(m["rope_interleave"], true);  // DeepseekV3Config's default
  EXPECT_EQ(m["rope_scaling"]["mscale_all_dim"], 1.0);
  EXPECT_EQ(m["rope_scaling"]["attention_factor"], 1.0);  // mscale / mscale_all_dim
  EXPECT_EQ(e["score_function"], "sigmoid");
  EXPECT_EQ(e["mlp_only_layers"], json({0, 1, 2}));  // first_k_dense_replace: 3 by default
  EXPECT_EQ(e["shared_expert_hidden_size"], 32);     // one shared expert
  EXPECT_EQ(e["routed_scaling_factor"], 2.5);
  EXPECT_EQ(e["group_score_experts"], 2);
}

TEST(HfDeepseek, V2RoutesWithSoftmaxAndNeverRenormalises) {
  std::vector<std::string> warnings;
  const json a = architecture_from_hf(
      deepseek("DeepseekV2ForCausalLM", {{"q_lora_rank", nullptr},
                                         {"topk_method", "group_limited_greedy"},
                                         {"n_group", 4},
                                         {"topk_group", 2},
                                         {"norm_topk_prob", true}}),
      "config.json", nullptr, &warnings);
  EXPECT_EQ(a["model"]["q_lora_rank"], 0);
  EXPECT_EQ(a["model"]["rope_interleave"], true);
  EXPECT_EQ(a["moe"]["score_function"], "softmax");
  EXPECT_EQ(a["moe"]["normalize_topk"], false);
  EXPECT_EQ(a["moe"]["group_score_experts"], 1);
  EXPECT_EQ(a["moe"]["shared_expert_hidden_size"], 64);  // two shared experts by default
  EXPECT_EQ(a["moe"].value("mlp_only_layers", json::array()), json::array());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("norm_topk_prob = true is not applied"), std::string::npos);
}

TEST(HfDeepseek, RefusalsNameTheKey) {
  EXPECT_EQ(import_error(deepseek("DeepseekV2ForCausalLM", {{"topk_method", "noaux_tc"}})),
            "hf: config.json: topk_method = \"noaux_tc\": expected greedy or group_limited_greedy "
            "(transformers' DeepseekV2)");
  EXPECT_EQ(import_error(deepseek("DeepseekV3ForCausalLM", {{"num_key_value_heads", 2}})),
            "hf: config.json: num_key_value_heads = 2: must equal num_attention_heads: latent "
            "attention gives every head its own keys");
  EXPECT_EQ(import_error(deepseek("DeepseekV3ForCausalLM", {{"kv_lora_rank", 0}})),
            "hf: config.json: kv_lora_rank = 0: expected a positive integer");
}
}  // namespace
}  // namespace moe::hf
