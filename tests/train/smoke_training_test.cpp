// CPU end-to-end: a tiny MoE model trains on the synthetic corpus and its loss falls.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_shard.h"
#include "moe/train/trainer.h"
#include "moe/util/remove_tree.h"

namespace moe::train {
namespace {

namespace fs = std::filesystem;

TEST(SmokeTraining, LossFallsOnCpu) {
  fs::path dir = fs::temp_directory_path() / ("moe_smoke_" + std::to_string(::getpid()));
  ::moe::remove_tree(dir);
  fs::create_directories(dir);
  data::SyntheticSpec spec;
  spec.vocab_size = 32;
  spec.programs = 2;
  spec.doc_len = 33;
  spec.num_docs = 512;
  data::write_shard((dir / "train.h5").string(), data::make_permutation_corpus(spec), 32,
                    "synthetic");
  spec.num_docs = 64;
  spec.doc_seed = 99;
  data::write_shard((dir / "valid.h5").string(), data::make_permutation_corpus(spec), 32,
                    "synthetic");

  nlohmann::json j = {
      {"train_batch_size", 16},
      {"optimizer", {{"params", {{"lr", 3e-3}}}}},
      {"scheduler",
       {{"type", "WarmupCosineLR"},
        {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"model",
       {{"vocab_size", 32},
        {"seq_len", 32},
        {"hidden_size", 32},
        {"num_layers", 2},
        {"num_heads", 2}}},
      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 64}}},
      {"data",
       {{"train_path", (dir / "train.h5").string()}, {"valid_path", (dir / "valid.h5").string()}}},
      {"training",
       {{"output_dir", (dir / "run").string()},
        {"train_iters", 120},
        {"eval_interval", 60},
        {"eval_iters", 4}}}};
  config::Config cfg = config::from_json(j, "smoke.json");
  config::validate(cfg);
  TrainSummary s = run_training(cfg, {});
  EXPECT_EQ(s.steps, 120);
  EXPECT_LT(s.last_train_loss, 0.5 * s.first_train_loss);
  ASSERT_TRUE(s.has_validation);
  EXPECT_LT(s.final_eval.loss, 0.5 * s.initial_eval.loss);
  EXPECT_GT(s.final_eval.accuracy, 0.5);
  EXPECT_LE(s.majority_baseline, 0.3);

  // One train line per step plus eval lines at 0, 60, 120; lr follows the schedule.
  std::ifstream in(dir / "run" / "metrics.jsonl");
  std::string line;
  int train = 0, eval = 0;
  while (std::getline(in, line)) {
    auto m = nlohmann::json::parse(line);
    if (m["type"] == "train") {
      ++train;
      EXPECT_TRUE(std::isfinite(m["grad_norm"].get<double>()));
    } else {
      ++eval;
    }
  }
  EXPECT_EQ(train, 120);
  EXPECT_EQ(eval, 3);
  ::moe::remove_tree(dir);
}

}  // namespace
}  // namespace moe::train
