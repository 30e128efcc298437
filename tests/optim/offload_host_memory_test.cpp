// Optimizer offload's host memory: the master weights, gradient staging (or streamed gradients)
// and moments that a real training run allocates are exactly what `moe-train plan` counts as
// the host's states, for each offload layout. The buffers come from one allocation per dtype
// (optim/host_arena.h), so the figure has no allocator rounding to hide.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_shard.h"
#include "moe/optim/host_arena.h"
#include "moe/plan/memory_plan.h"
#include "moe/train/trainer.h"
#include "moe/util/remove_tree.h"

namespace moe::optim {
namespace {

namespace fs = std::filesystem;

TEST(HostArena, PacksEachDtypeIntoOneBufferWithExactBytes) {
  HostArena arena;
  const size_t a = arena.add({3, 5}, at::kFloat);
  const size_t b = arena.add({7}, at::kBFloat16);
  const size_t c = arena.add({2, 2}, at::kFloat);
  const size_t empty = arena.add({0, 4}, at::kFloat);
  arena.allocate();
  EXPECT_EQ(arena.bytes(), (15 + 4) * 4 + 7 * 2);
  EXPECT_EQ(arena[a].sizes(), at::IntArrayRef({3, 5}));
  EXPECT_EQ(arena[b].scalar_type(), at::kBFloat16);
  EXPECT_EQ(arena[empty].numel(), 0);
  // Same dtype: one storage, back to back; another dtype: a storage of its own.
  EXPECT_TRUE(arena[a].storage().is_alias_of(arena[c].storage()));
  EXPECT_EQ(static_cast<int64_t>(arena[a].storage().nbytes()), 19 * 4);
  EXPECT_EQ(arena[c].storage_offset(), 15);
  EXPECT_FALSE(arena[a].storage().is_alias_of(arena[b].storage()));
  // The views do not overlap: writing one leaves the others.
  arena[a].fill_(1.0f);
  arena[c].fill_(2.0f);
  EXPECT_EQ(arena[a].sum().item<float>(), 15.0f);
  EXPECT_EQ(arena[c].sum().item<float>(), 8.0f);
  EXPECT_THROW(arena.add({1}, at::kFloat), c10::Error);
  EXPECT_FALSE(arena.pinned());
}

void write_data(const fs::path& dir) {
  data::SyntheticSpec spec;
  spec.vocab_size = 32;
  spec.programs = 2;
  spec.doc_len = 33;
  spec.num_docs = 128;
  data::write_shard((dir / "train.h5").string(), data::make_permutation_corpus(spec), 32,
                    "synthetic");
}

struct Layout {
  std::string name;
  nlohmann::json patch;  // merged into the base run
};

class OffloadHostBytes : public ::testing::TestWithParam<Layout> {};

TEST_P(OffloadHostBytes, PlannedEqualsAllocated) {
  const Layout& l = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("moe_offload_host_" + l.name + std::to_string(::getpid()));
  ::moe::remove_tree(dir);
  fs::create_directories(dir);
  write_data(dir);
  nlohmann::json j = {{"train_batch_size", 8},
                      {"optimizer", {{"params", {{"lr", 3e-3}}}}},
                      {"gradient_clipping", 1.0},
                      {"steps_per_print", 1000},
                      {"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}},
                      {"model",
                       {{"vocab_size", 32},
                        {"seq_len", 32},
                        {"hidden_size", 32},
                        {"num_layers", 2},
                        {"num_heads", 2}}},
                      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 48}}},
                      {"data", {{"train_path", (dir / "train.h5").string()}}},
                      {"training", {{"output_dir", (dir / "run").string()}, {"train_iters", 2}}}};
  j.merge_patch(l.patch);
  config::Config cfg = config::from_json(j, l.name + ".json");
  config::validate(cfg);
  const train::TrainSummary s = train::run_training(cfg, {});
  const plan::MemoryPlan plan = plan::plan_memory(cfg, plan::PlanOptions{.cpu = true});
  ASSERT_GT(plan.host_states, 0);
  EXPECT_EQ(static_cast<double>(s.offload_host_bytes), plan.host_states)
      << "allocated " << s.offload_host_bytes << " B, planned " << plan.host_states << " B for "
      << plan.parameters << " parameters";
  ::moe::remove_tree(dir);
}

// Each offload layout the planner distinguishes: gradients copied after the backward (staging
// in the gradients' dtype) or streamed during it (fp32 gradients, 16-bit staging for 16-bit
// weights); fp32 or bf16 working weights, summed over micro-batches in fp32 or not; fp32 or
// bf16 moments; q/k norms (more fp32 parameters under bf16 weights); LoRA (only the adapters are
// offloaded).
INSTANTIATE_TEST_SUITE_P(
    Layouts, OffloadHostBytes,
    ::testing::Values(
        Layout{"fp32_after_backward", {{"zero_optimization", {{"overlap_comm", false}}}}},
        Layout{"fp32_streamed", {{"zero_optimization", {{"overlap_comm", true}}}}},
        Layout{"bf16_streamed_bf16_moments",
               {{"zero_optimization", {{"overlap_comm", true}}},
                {"bf16", {{"enabled", true}}},
                {"training", {{"param_dtype", "bf16"}}},
                {"optimizer", {{"exp_avg_dtype", "bf16"}, {"exp_avg_sq_dtype", "bf16"}}}}},
        Layout{"bf16_streamed_qk_norm",
               {{"zero_optimization", {{"overlap_comm", true}}},
                {"bf16", {{"enabled", true}}},
                {"model", {{"qk_norm", true}}},
                {"training", {{"param_dtype", "bf16"}}}}},
        Layout{"bf16_after_backward",
               {{"zero_optimization", {{"overlap_comm", false}}},
                {"bf16", {{"enabled", true}}},
                {"training", {{"param_dtype", "bf16"}}}}},
        Layout{"bf16_after_backward_accumulated",
               {{"zero_optimization", {{"overlap_comm", false}}},
                {"gradient_accumulation_steps", 2},
                {"bf16", {{"enabled", true}}},
                {"training", {{"param_dtype", "bf16"}}}}},
        Layout{"lora_streamed",
               {{"zero_optimization", {{"overlap_comm", true}}}, {"lora", {{"r", 4}}}}}),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

}  // namespace
}  // namespace moe::optim
