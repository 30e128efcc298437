// The data-parallel boundary (src/parallel/data_parallel.cpp) driven through the step runner:
//   - a Gloo group of one rank in every mode (DDP Reducer, all-reduce after the backward, ZeRO-1,
//     ZeRO-2 reducing onto owners or after the backward) trains bitwise like LocalTraining: with
//     one rank every reduction must be the identity, so any stray scaling, lost gradient or
//     reordered update shows;
//   - two ranks (two threads, one Gloo group each, one model each: nothing process-wide is
//     shared, the routers hold their own load reduction) match LocalTraining on the global batch
//     to 1e-5 relative, at ZeRO 0 and 2.
#include <gtest/gtest.h>

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <cstdlib>

#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/optim/loss_scaler.h"
#include "moe/parallel/data_parallel.h"
#include "moe/parallel/process_group.h"
#include "moe/train/step_runner.h"
#include "util/free_port.h"

namespace moe::train {
namespace {

using config::GradientReduction;

using ::moe::test::free_port;

config::Config tiny(int64_t world, int64_t micro, int64_t accumulation, int64_t stage) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                      {"gradient_accumulation_steps", accumulation},
                      {"train_batch_size", micro * accumulation * world},
                      {"gradient_clipping", 0.5},
                      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 3000}}},
                      {"model",
                       {{"vocab_size", 48},
                        {"seq_len", 12},
                        {"hidden_size", 16},
                        {"num_layers", 2},
                        {"num_heads", 2}}},
                      {"moe", {{"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 24}}},
                      {"data", {{"train_path", "unused.h5"}}}};
  config::Config c = config::from_json(j, "test.json");
  c.world_size = world;
  config::validate(c);
  return c;
}

struct Trace {
  std::vector<double> losses, norms;
  std::vector<torch::Tensor> params;
};

std::mutex g_seed;  // torch::manual_seed is process-wide: one model built at a time

// `steps` optimizer steps; `batches[s * A + m]` is micro-step m of step s for the global
// micro-batch, of which this rank takes its slice.
Trace train(const config::Config& cfg, DataParallel& dp, const std::vector<torch::Tensor>& batches,
            int64_t steps) {
  model::TransformerLM model{nullptr};
  {
    std::lock_guard<std::mutex> lock(g_seed);
    torch::manual_seed(11);
    model = model::TransformerLM(cfg, torch::Device(torch::kCPU), dp.moe_parallel());
  }
  model->train();
  dp.attach(model);
  optim::AdamWGroup group;
  group.weight_decay = 0.1;
  for (auto& item : model->named_parameters()) {
    if (!dp.updates(item.key())) continue;
    group.names.push_back(item.key());
    group.params.push_back(item.value());
  }
  optim::FusedAdamW optimizer({group}, 0.9, 0.95, 1e-8);
  optim::LossScaler scaler(cfg.fp16);
  StepRunnerOptions so;
  so.micro_batches = cfg.gradient_accumulation_steps;
  so.max_norm = cfg.gradient_clipping;
  so.dp = &dp;
  dp.start(model);
  auto runner = make_step_runner(model, cfg, optimizer, scaler, so, torch::Device(torch::kCPU), 0,
                                 *spdlog::default_logger());
  Trace t;
  size_t next = 0;
  const int64_t B = cfg.train_micro_batch_size_per_gpu;
  for (int64_t step = 0; step < steps; ++step) {
    StepResult r =
        runner->run(step, 3e-3, [&] { return batches[next++].narrow(0, dp.rank() * B, B); });
    runner->update(3e-3);
    t.losses.push_back(r.lm_sum);
    t.norms.push_back(r.grad_norm);
  }
  for (const auto& p : model->parameters()) t.params.push_back(p.detach().clone());
  return t;
}

std::vector<torch::Tensor> make_batches(int64_t count, int64_t rows) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < count; ++i)
    out.push_back(torch::randint(0, 48, {rows, 13}, torch::kLong));
  return out;
}

Trace local(const config::Config& cfg, const std::vector<torch::Tensor>& batches, int64_t steps) {
  auto dp = DataParallel::create(cfg, parallel::LaunchEnv{}, false, *spdlog::default_logger());
  return train(cfg, *dp, batches, steps);
}

struct ModeCase {
  const char* name;
  int64_t stage;
  GradientReduction reduction;
};

TEST(DataParallelBoundary, AGroupOfOneIsTheIdentityInEveryMode) {
  const std::vector<ModeCase> modes = {
      {"stage 0, DDP Reducer", 0, GradientReduction::kReducerInBackward},
      {"stage 0, all-reduce after", 0, GradientReduction::kAllReduceAfterBackward},
      {"stage 1, DDP Reducer", 1, GradientReduction::kReducerInBackward},
      {"stage 2, reduce onto owners", 2, GradientReduction::kReduceToOwnersInBackward},
      {"stage 2, all-reduce after", 2, GradientReduction::kAllReduceAfterBackward}};
  const int64_t steps = 3, accumulation = 2;
  const auto batches = make_batches(steps * accumulation, 4);
  for (const auto& m : modes) {
    const config::Config cfg = tiny(1, 4, accumulation, m.stage);
    const Trace want = local(cfg, batches, steps);
    parallel::LaunchEnv env;
    env.master_port = free_port();
    auto group = std::make_unique<parallel::ProcessGroup>(env, config::DistBackend::kGloo,
                                                          std::chrono::seconds(60));
    config::DataParallelMode mode;
    mode.world_size = 1;
    mode.zero_stage = m.stage;
    mode.reduction = m.reduction;
    auto dp = DataParallel::over(cfg, std::move(group), mode);
    const Trace got = train(cfg, *dp, batches, steps);
    EXPECT_EQ(got.losses, want.losses) << m.name;
    EXPECT_EQ(got.norms, want.norms) << m.name;
    ASSERT_EQ(got.params.size(), want.params.size());
    for (size_t i = 0; i < got.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(got.params[i], want.params[i])) << m.name << ", parameter " << i;
    }
  }
}

double relative(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::abs(b)); }

TEST(DataParallelBoundary, TwoRanksAsThreadsMatchOneProcessOnTheGlobalBatch) {
  // Two ranks' Gloo groups in one process share c10d's FlightRecorder singleton, whose
  // recordWithResetEnabled races between groups (SIGSEGV in its std::map insert, seen twice in
  // 2026-12-02's runs; pytorch/pytorch#179313 describes the race). A real run has one rank per
  // process; here the recorder is switched off before any group exists.
  ::setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
  const int64_t steps = 4, accumulation = 2, micro = 2;
  const auto batches = make_batches(steps * accumulation, 2 * micro);
  // ZeRO 0, ZeRO 2, and expert parallelism of 2 (each rank holds half the experts) without and
  // with ZeRO 2.
  for (const auto& [stage, ep] : {std::pair<int64_t, int64_t>{0, 1}, {2, 1}, {0, 2}, {2, 2}}) {
    const config::Config one = tiny(1, 2 * micro, accumulation, stage);
    const Trace want = local(one, batches, steps);
    config::Config two = tiny(2, micro, accumulation, stage);
    two.moe.expert_parallel_size = ep;
    const int64_t port = free_port();
    std::vector<Trace> got(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int64_t r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        try {
          parallel::LaunchEnv env;
          env.rank = r;
          env.world_size = 2;
          env.master_port = port;
          auto group = std::make_unique<parallel::ProcessGroup>(env, config::DistBackend::kGloo,
                                                                std::chrono::seconds(60));
          auto dp = DataParallel::over(two, std::move(group), config::data_parallel_mode(two, 2));
          got[static_cast<size_t>(r)] = train(two, *dp, batches, steps);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    ASSERT_TRUE(errors[0].empty() && errors[1].empty()) << errors[0] << " | " << errors[1];
    for (const Trace& g : got) {
      for (int64_t s = 0; s < steps; ++s) {
        const auto i = static_cast<size_t>(s);
        EXPECT_LE(relative(g.losses[i], want.losses[i]), 1e-5)
            << "stage " << stage << " EP " << ep << " step " << s;
        EXPECT_LE(relative(g.norms[i], want.norms[i]), 1e-5)
            << "stage " << stage << " EP " << ep << " step " << s;
      }
    }
    if (ep > 1) continue;  // each rank holds other experts
    // Both ranks end with the same weights (ZeRO owners broadcast theirs after each update).
    for (size_t i = 0; i < got[0].params.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[0].params[i], got[1].params[i]))
          << "stage " << stage << ", " << i;
    }
  }
}

}  // namespace
}  // namespace moe::train
