// The NCCL process group on one GPU (label `gpu`; skipped without a device): a world of one rank
// runs every collective the trainer uses (all-reduce in buckets, sum, broadcast, the async reduce
// of ZeRO-2, barrier, the config exchange) and the DDP Reducer's backward, on device tensors and
// on host tensors routed through the GPU. At world size 1 each is the identity, which makes the
// expected values exact; what it proves is that the NCCL path is built, links and runs.
#include <gtest/gtest.h>

#include <chrono>

#include <torch/torch.h>

#include "moe/moe/expert_parallel.h"
#include "moe/moe/experts.h"
#include "moe/parallel/process_group.h"
#include "util/free_port.h"

namespace moe::parallel {
namespace {

using ::moe::test::free_port;

// A world of one answers at once; a wedged collective or store must fail this test well inside
// scripts/gpu-check's gpu-tests step (90 s for every suite), not outwait it.
constexpr std::chrono::seconds kTimeout{20};

TEST(NcclGpu, WorldOfOneRunsEveryCollectiveAndTheReducer) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LaunchEnv env;
  env.master_port = free_port();
  ProcessGroup pg(env, ::moe::config::DistBackend::kNccl, kTimeout);
  ASSERT_EQ(pg.backend(), ::moe::config::DistBackend::kNccl);
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(3);

  // Mean in small buckets (several collectives), device and host tensors.
  std::vector<torch::Tensor> ts = {torch::randn({1000}, dev), torch::randn({3, 5}, dev),
                                   torch::randn({7}, torch::kFloat)};
  std::vector<torch::Tensor> before;
  for (const auto& t : ts) before.push_back(t.clone());
  pg.allreduce_mean({ts[0], ts[1]}, 1 << 10);
  pg.allreduce_mean({ts[2]}, 1 << 10);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_TRUE(torch::equal(ts[i], before[i])) << i;

  auto host = torch::arange(10, torch::kDouble);
  pg.allreduce_sum(host);
  EXPECT_TRUE(torch::equal(host, torch::arange(10, torch::kDouble)));
  auto b = torch::full({4}, 2.5, torch::TensorOptions(dev));
  pg.broadcast(b, 0);
  EXPECT_TRUE(torch::equal(b.cpu(), torch::full({4}, 2.5)));
  auto r = torch::randn({64}, dev), r0 = r.clone();
  pg.reduce_sum_async(r, 0)();
  EXPECT_TRUE(torch::equal(r, r0));
  pg.barrier();
  EXPECT_EQ(pg.allgather_text("nccl-test", "hello"), std::vector<std::string>{"hello"});

  // The Reducer: gradients synchronised in the backward equal the plain backward's.
  torch::nn::Linear a(16, 4), plain(16, 4);
  a->to(dev);
  plain->to(dev);
  {
    torch::NoGradGuard g;
    plain->weight.copy_(a->weight);
    plain->bias.copy_(a->bias);
  }
  pg.enable_gradient_sync(a->parameters(), 1 << 20);
  ASSERT_TRUE(pg.gradient_sync_enabled());
  const auto x = torch::randn({8, 16}, dev);
  auto loss = a(x).square().sum();
  pg.prepare_gradient_sync(loss);
  loss.backward();
  plain(x).square().sum().backward();
  EXPECT_TRUE(torch::allclose(a->weight.grad(), plain->weight.grad(), 0, 0));
  EXPECT_TRUE(torch::allclose(a->bias.grad(), plain->bias.grad(), 0, 0));
}

// Expert parallelism's exchange on NCCL with a world of one: the counts and the rows go to this
// rank itself through alltoall_base, forward and backward, and the experts' output and every
// gradient equal the local path's exactly. Subgroups and the row gather run too.
TEST(NcclGpu, ExpertAllToAllWorldOfOneMatchesTheLocalPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LaunchEnv env;
  env.master_port = free_port();
  ProcessGroup pg(env, ::moe::config::DistBackend::kNccl, kTimeout);
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(5);
  ::moe::moe::ExpertsOptions o;
  o.num_experts = 4, o.hidden_size = 32, o.ffn_size = 48;
  ::moe::moe::Experts experts(o);
  experts->to(dev);
  const auto counts = torch::tensor({5, 0, 9, 2}, torch::kLong);
  const auto rows = torch::randn({16, 32}, dev).requires_grad_(true);
  const auto rows_local = rows.detach().clone().requires_grad_(true);
  const int64_t group = pg.new_group({0});
  EXPECT_EQ(pg.group_size(group), 1);
  ::moe::moe::ExpertParallel ep{1, 0,
                                [&pg](const torch::Tensor& r, const std::vector<int64_t>& send,
                                      const std::vector<int64_t>& recv) {
                                  return pg.all_to_all(r, send, recv);  // the world: NCCL itself
                                }};
  auto local = [&](const torch::Tensor& r, const torch::Tensor& c) {
    return experts->forward(r, c);
  };
  const auto y = ::moe::moe::experts_across_ranks(rows, counts, ep, local);
  const auto g = torch::randn_like(y);
  y.backward(g);
  const auto rows_grad = rows.grad().clone();
  std::vector<torch::Tensor> ep_grads;
  for (auto& p : experts->parameters())
    ep_grads.push_back(p.grad().clone()), p.mutable_grad() = torch::Tensor();
  const auto y_local = experts->forward(rows_local, counts);
  y_local.backward(g);
  EXPECT_TRUE(torch::equal(y, y_local));
  EXPECT_TRUE(torch::equal(rows_grad, rows_local.grad()));
  const auto params = experts->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(ep_grads[i], params[i].grad())) << i;
  const auto t = torch::randn({3, 4}, dev);
  EXPECT_TRUE(torch::equal(pg.all_gather_rows(t), t));
  EXPECT_TRUE(torch::equal(pg.all_gather_rows(t, group), t));
}

}  // namespace
}  // namespace moe::parallel
