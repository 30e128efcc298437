// Expert parallelism in the MoE layer (src/moe/expert_parallel.cpp): two ranks (two threads, a
// Gloo group each) holding two of four experts each, rows exchanged with all-to-all, against one
// layer holding all four run on each rank's tokens: outputs, input gradients, expert weight
// gradients and router gradients agree to 1e-5, dropless and with a capacity that drops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "moe/moe/moe_layer.h"
#include "moe/parallel/process_group.h"
#include "util/free_port.h"

namespace moe::moe {
namespace {

constexpr int64_t kExperts = 4, kHidden = 16, kTokens = 10;

MoeLayerOptions layer_options(double capacity) {
  MoeLayerOptions o;
  o.router.hidden_size = kHidden;
  o.router.num_experts = kExperts;
  o.router.top_k = 2;
  o.router.capacity_factor = capacity;
  o.experts.num_experts = kExperts;
  o.experts.hidden_size = kHidden;
  o.experts.ffn_size = 24;
  return o;
}

std::mutex g_seed;  // torch::manual_seed is process-wide: one layer built at a time

MoeLayer build(MoeLayerOptions o) {
  std::lock_guard<std::mutex> lock(g_seed);
  torch::manual_seed(7);
  return MoeLayer(o);
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

struct RankResult {
  torch::Tensor y, x_grad, router_grad, w_gate_grad, w_up_grad, w_down_grad;
  int64_t dropped = 0;
};

void check(double capacity) {
  std::vector<torch::Tensor> x, w;
  torch::manual_seed(3);
  for (int r = 0; r < 2; ++r) {
    x.push_back(torch::randn({kTokens, kHidden}));
    w.push_back(torch::randn({kTokens, kHidden}));  // a loss that weighs every output
  }
  // One layer with every expert, each rank's tokens on their own (the capacity is per rank).
  MoeLayer full = build(layer_options(capacity));
  std::vector<RankResult> want(2);
  for (int r = 0; r < 2; ++r) {
    auto xr = x[static_cast<size_t>(r)].clone().requires_grad_(true);
    auto out = full->forward(xr);
    (out.y * w[static_cast<size_t>(r)]).sum().backward();
    want[static_cast<size_t>(r)].y = out.y.detach();
    want[static_cast<size_t>(r)].x_grad = xr.grad();
    want[static_cast<size_t>(r)].dropped = out.dropped;
  }
  // Two ranks, two experts each.
  const int64_t port = ::moe::test::free_port();
  std::vector<RankResult> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        parallel::LaunchEnv env;
        env.rank = r;
        env.world_size = 2;
        env.master_port = port;
        parallel::ProcessGroup group(env, config::DistBackend::kGloo, std::chrono::seconds(60));
        MoeLayerOptions o = layer_options(capacity);
        o.ep.size = 2;
        o.ep.rank = r;
        o.ep.all_to_all = [&group](const torch::Tensor& rows, const std::vector<int64_t>& send,
                                   const std::vector<int64_t>& recv) {
          return group.all_to_all(rows, send, recv);
        };
        MoeLayer layer = build(o);
        EXPECT_EQ(layer->experts->w_gate.size(0), kExperts / 2);
        const auto i = static_cast<size_t>(r);
        auto xr = x[i].clone().requires_grad_(true);
        auto out = layer->forward(xr);
        (out.y * w[i]).sum().backward();
        got[i] = {out.y.detach(),
                  xr.grad(),
                  layer->router->parameters().front().grad(),
                  layer->experts->w_gate.grad(),
                  layer->experts->w_up.grad(),
                  layer->experts->w_down.grad(),
                  out.dropped};
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(errors[0].empty() && errors[1].empty()) << errors[0] << " | " << errors[1];
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_LE(relative(got[r].y, want[r].y), 1e-5) << "rank " << r;
    EXPECT_LE(relative(got[r].x_grad, want[r].x_grad), 1e-5) << "rank " << r;
    EXPECT_EQ(got[r].dropped, want[r].dropped);
    // Expert gradients: rank r's experts collect both ranks' rows.
    const auto first = static_cast<int64_t>(r) * (kExperts / 2);
    EXPECT_LE(relative(got[r].w_gate_grad, full->experts->w_gate.grad().narrow(0, first, 2)), 1e-5);
    EXPECT_LE(relative(got[r].w_up_grad, full->experts->w_up.grad().narrow(0, first, 2)), 1e-5);
    EXPECT_LE(relative(got[r].w_down_grad, full->experts->w_down.grad().narrow(0, first, 2)), 1e-5);
  }
  // The router is replicated: its gradients over both ranks sum to the full layer's.
  EXPECT_LE(
      relative(got[0].router_grad + got[1].router_grad, full->router->parameters().front().grad()),
      1e-5);
  if (capacity > 0) {
    EXPECT_GT(want[0].dropped + want[1].dropped, 0);  // the limit really drops
  }
}

TEST(ExpertParallel, TwoRanksMatchOneLayerDropless) { check(0.0); }

TEST(ExpertParallel, TwoRanksMatchOneLayerWithCapacity) { check(0.6); }

}  // namespace
}  // namespace moe::moe
