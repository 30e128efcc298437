// training.cuda_graph on a GPU (label `gpu`; skipped without an sm_90+ device): the captured step
// gives the same losses and grad norms as eager steps, and the metrics say which steps replayed.
#include <gtest/gtest.h>

#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_shard.h"
#include "moe/moe/experts.h"
#include "moe/train/cuda_graph_step.h"
#include "moe/train/trainer.h"
#include "moe/util/remove_tree.h"

namespace moe::train {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> train_records(const fs::path& dir) {
  std::vector<nlohmann::json> v;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto m = nlohmann::json::parse(line);
    if (m["type"] == "train") v.push_back(m);
  }
  return v;
}

TEST(CudaGraphGpu, SameLossesAsEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!moe::experts_grouped_mm_supported(torch::Device(torch::kCUDA, 0)))
    GTEST_SKIP() << "the graph needs the sm_90 grouped-GEMM experts";
  fs::path dir = fs::temp_directory_path() / ("moe_graph_" + std::to_string(::getpid()));
  ::moe::remove_tree(dir);
  fs::create_directories(dir);
  data::SyntheticSpec spec;
  spec.vocab_size = 64;
  spec.programs = 4;
  spec.doc_len = 65;
  spec.num_docs = 1024;
  data::write_shard((dir / "train.h5").string(), data::make_permutation_corpus(spec), 64,
                    "synthetic");
  auto run = [&](bool graph, const std::string& name) {
    nlohmann::json j = {{"train_batch_size", 32},
                        {"train_micro_batch_size_per_gpu", 16},
                        {"optimizer", {{"params", {{"lr", 3e-3}}}}},
                        {"gradient_clipping", 1.0},
                        {"steps_per_print", 1000},
                        {"bf16", {{"enabled", true}}},
                        {"model",
                         {{"vocab_size", 64},
                          {"seq_len", 64},
                          {"hidden_size", 64},
                          {"num_layers", 2},
                          {"num_heads", 4}}},
                        {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 128}}},
                        {"data", {{"train_path", (dir / "train.h5").string()}, {"shuffle", false}}},
                        {"training",
                         {{"output_dir", (dir / name).string()},
                          {"train_iters", 12},
                          {"device", "cuda"},
                          {"cuda_graph", graph}}},
                        {"checkpoint", {{"save_final", false}}}};
    config::Config cfg = config::from_json(j, name + ".json");
    config::validate(cfg);
    ASSERT_EQ(cuda_graph_ineligible_reason(cfg, torch::Device(torch::kCUDA)), "");
    run_training(cfg, {});
  };
  run(false, "eager");
  run(true, "graph");
  auto eager = train_records(dir / "eager"), graph = train_records(dir / "graph");
  ASSERT_EQ(eager.size(), 12u);
  ASSERT_EQ(graph.size(), 12u);
  for (size_t i = 0; i < graph.size(); ++i) {
    EXPECT_EQ(graph[i]["cuda_graph"].get<bool>(), i >= 3) << "step " << i + 1;
    const double a = eager[i]["loss"].get<double>(), b = graph[i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 1e-3 * std::abs(a)) << "step " << i + 1;
    const double ga = eager[i]["grad_norm"].get<double>(), gb = graph[i]["grad_norm"].get<double>();
    EXPECT_NEAR(gb, ga, 1e-2 * ga) << "step " << i + 1;
  }
  ::moe::remove_tree(dir);
}

}  // namespace
}  // namespace moe::train
