// The expert offload ring (layers/offload_ring.h) on a GPU (label `gpu`, in moe_gpu_tests;
// skipped without a device):
//  - pinned host buffers, device slots and copies on a side stream: a forward-backward walk over
//    8 layers whose compute (a GEMM per layer on the compute stream) reads each slot right after
//    the fetch gives exactly the GEMMs over device copies made the plain way (a missing wait on
//    the copy's event, or a slot overwritten while its readers are queued, would change them);
//  - the allocator's counters: the ring's device bytes grow by its 2 slots of one layer, not by
//    the 8 layers it serves;
//  - the grouped-GEMM form (sm_90): its forward is bitwise at::_grouped_mm's over the stack kept
//    on the device, x's gradient within bf16 rounding (autograd's backward may lay the GEMM out
//    another way).
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "moe/layers/offload_ring.h"
#include "moe/moe/experts.h"

namespace moe::layers {
namespace {

int64_t allocated_bytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

TEST(OffloadRingGpu, OverlappedCopiesGiveExactGemmsAndHoldTwoLayers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(1);
  const torch::Device cuda(torch::kCUDA, 0);
  constexpr int64_t kLayers = 8;
  std::vector<torch::Tensor> stacks;  // [E, d, f] bf16 on the host, 8 MiB each
  for (int64_t i = 0; i < kLayers; ++i) {
    stacks.push_back(torch::randn({16, 512, 512}).to(torch::kBFloat16));
  }
  std::vector<torch::Tensor> on_device;
  for (const auto& s : stacks) on_device.push_back(s.to(cuda));
  const auto x = torch::randn({256, 512}, torch::TensorOptions(cuda).dtype(torch::kBFloat16));
  torch::cuda::synchronize();
  const int64_t before = allocated_bytes();
  auto ring = std::make_shared<OffloadRing>(2, cuda);
  for (int64_t i = 0; i < kLayers; ++i) {
    ring->add_layer(i, [&stacks, i] { return std::vector<torch::Tensor*>{&stacks[i]}; });
  }
  std::vector<int64_t> walk;
  for (int64_t i = 0; i < kLayers; ++i) walk.push_back(i);
  for (int64_t i = kLayers - 1; i >= 0; --i) walk.push_back(i);
  for (int pass = 0; pass < 2; ++pass) {
    for (const int64_t layer : walk) {
      const auto& w = ring->fetch(layer)[0];
      for (int64_t e : {0, 7, 15}) {
        const auto got = x.matmul(w[e]);
        const auto want = x.matmul(on_device[static_cast<size_t>(layer)][e]);
        ASSERT_TRUE(torch::equal(got, want)) << "layer " << layer << " expert " << e;
      }
    }
  }
  torch::cuda::synchronize();
  const int64_t ring_bytes = allocated_bytes() - before;
  const int64_t layer_bytes = ring->largest_layer_bytes();
  EXPECT_LE(ring_bytes, 2 * layer_bytes + (2 << 20)) << "the ring holds more than 2 layers";
  EXPECT_EQ(ring->counters().peak_slot_bytes, 2 * layer_bytes);
  EXPECT_TRUE(stacks[0].is_pinned());
  const OffloadCounters c = ring->counters();
  EXPECT_EQ(c.fetches, c.hits + c.copies - c.prefetches);
  EXPECT_GE(c.hits, static_cast<int64_t>(walk.size()) * 2 - 2);
}

TEST(OffloadRingGpu, GroupedFormMatchesGroupedMmOnTheDeviceStack) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  if (!::moe::moe::experts_grouped_mm_supported(cuda)) GTEST_SKIP() << "not sm_90";
  torch::manual_seed(2);
  torch::Tensor stack = torch::randn({4, 64, 96}).to(torch::kBFloat16);
  const auto reference = stack.to(cuda);
  auto ring = std::make_shared<OffloadRing>(2, cuda);
  ring->add_layer(0, [&stack] { return std::vector<torch::Tensor*>{&stack}; });
  const auto offs = torch::tensor({16, 40, 40, 72}, torch::TensorOptions(cuda).dtype(torch::kInt));
  const auto base = torch::randn({72, 64}, torch::TensorOptions(cuda).dtype(torch::kBFloat16));
  auto x1 = base.clone().requires_grad_(true), x2 = base.clone().requires_grad_(true);
  const auto y1 = at::_grouped_mm(x1, reference, offs);
  const auto y2 = frozen_grouped_mm(x2, OffloadedPlace{ring, 0, 0}, offs);
  EXPECT_TRUE(torch::equal(y1, y2));
  const auto g = torch::randn_like(y1);
  y1.backward(g);
  y2.backward(g);
  EXPECT_TRUE(
      torch::allclose(x1.grad().to(torch::kFloat), x2.grad().to(torch::kFloat), 1e-2, 1e-2));
}

}  // namespace
}  // namespace moe::layers
