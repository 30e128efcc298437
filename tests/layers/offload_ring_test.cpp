// The expert offload ring (layers/offload_ring.h) on the CPU, where its "device" buffers are a
// second set of host buffers reached through the same copies.
#include "moe/layers/offload_ring.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace moe::layers {
namespace {

// Layer i's frozen tensors: a bf16 stack, an fp32 matrix, an undefined one and a uint8 vector.
struct FakeLayer {
  torch::Tensor stack, matrix, none, codes;
  explicit FakeLayer(int64_t i) {
    stack = torch::randn({3, 4, 5}).to(torch::kBFloat16);
    matrix = torch::randn({7, 3}) + static_cast<double>(i);
    codes = torch::randint(0, 255, {33}, torch::kByte);
  }
  std::vector<torch::Tensor> values() const {
    return {stack.clone(), matrix.clone(), codes.clone()};
  }
};

std::shared_ptr<OffloadRing> ring_over(std::vector<FakeLayer>& layers, int64_t slots) {
  auto ring = std::make_shared<OffloadRing>(slots, torch::Device(torch::kCPU));
  for (size_t i = 0; i < layers.size(); ++i) {
    auto& l = layers[i];
    ring->add_layer(static_cast<int64_t>(2 * i + 1), [&l] {
      return std::vector<torch::Tensor*>{&l.stack, &l.matrix, &l.none, &l.codes};
    });
  }
  return ring;
}

void expect_fetched(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(torch::equal(got[0], want[0]));
  EXPECT_EQ(got[0].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(got[1], want[1]));
  EXPECT_FALSE(got[2].defined());
  EXPECT_TRUE(torch::equal(got[3], want[2]));
}

TEST(OffloadRing, FetchesExactValuesIntoSeparateBuffersAndPrefetchesTheNextLayer) {
  torch::manual_seed(3);
  std::vector<FakeLayer> layers;
  for (int64_t i = 0; i < 4; ++i) layers.emplace_back(i);
  std::vector<std::vector<torch::Tensor>> want;
  for (const auto& l : layers) want.push_back(l.values());
  auto ring = ring_over(layers, 2);
  // A forward (layers 1, 3, 5, 7) and a backward (7, 5, 3, 1), twice.
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i : {0, 1, 2, 3, 3, 2, 1, 0}) {
      const auto& got = ring->fetch(2 * i + 1);
      expect_fetched(got, want[static_cast<size_t>(i)]);
      // The slot is not the host tensor: a separate buffer, filled by a copy.
      EXPECT_NE(got[1].data_ptr(), layers[static_cast<size_t>(i)].matrix.data_ptr());
    }
  }
  const OffloadCounters c = ring->counters();
  EXPECT_EQ(c.fetches, 16);
  // Every fetch but the very first finds its layer copied ahead (or still there at the turns).
  EXPECT_EQ(c.hits, 15);
  EXPECT_EQ(c.fetches, c.hits + c.copies - c.prefetches);
  EXPECT_EQ(c.slot_allocations, 2);
  EXPECT_EQ(c.peak_slot_bytes, 2 * ring->largest_layer_bytes());
  // The host tensors now live in the packed buffers, with their values.
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_TRUE(torch::equal(layers[i].matrix, want[i][1]));
    EXPECT_TRUE(torch::equal(layers[i].stack, want[i][0]));
  }
}

TEST(OffloadRing, RepacksReplacedTensorsAndForgetsSlotsWhenInvalidated) {
  torch::manual_seed(4);
  std::vector<FakeLayer> layers;
  for (int64_t i = 0; i < 3; ++i) layers.emplace_back(i);
  auto ring = ring_over(layers, 2);
  ring->fetch(1);
  // Replaced (loaded weights, requantized): packed again at the next fetch.
  layers[0].matrix = torch::full({7, 3}, 2.5);
  EXPECT_TRUE(torch::equal(ring->fetch(1)[1], torch::full({7, 3}, 2.5)));
  // Changed in place (a merge): the slot is stale until invalidated.
  torch::NoGradGuard g;
  layers[0].matrix.add_(1.0);
  ring->invalidate();
  EXPECT_TRUE(torch::equal(ring->fetch(1)[1], torch::full({7, 3}, 3.5)));
}

TEST(OffloadRing, FrozenExpertMatmulMatchesAutogradMmBitwise) {
  torch::manual_seed(5);
  torch::Tensor stack = torch::randn({4, 6, 5});
  auto ring = std::make_shared<OffloadRing>(2, torch::Device(torch::kCPU));
  const torch::Tensor reference = stack.clone();
  ring->add_layer(0, [&stack] { return std::vector<torch::Tensor*>{&stack}; });
  const OffloadedPlace place{ring, 0, 0};
  for (const bool column_major : {false, true}) {
    // Column-major x: mm_mat1_backward returns a column-major gradient (clone keeps strides).
    auto x1 = (column_major ? torch::randn({6, 9}).t() : torch::randn({9, 6}))
                  .detach()
                  .requires_grad_(true);
    auto x2 = x1.detach().clone().requires_grad_(true);
    const auto y1 = x1.matmul(reference[2]);
    const auto y2 = frozen_expert_matmul(x2, place, 2);
    EXPECT_TRUE(torch::equal(y1, y2));
    const auto g = torch::randn_like(y1);
    y1.backward(g);
    y2.backward(g);
    EXPECT_TRUE(torch::equal(x1.grad(), x2.grad())) << "column major " << column_major;
    EXPECT_EQ(x1.grad().strides(), x2.grad().strides());
  }
}

}  // namespace
}  // namespace moe::layers
