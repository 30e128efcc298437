// OffloadGradientStream: the host fp32 gradients it collects during the backward are exactly
// what autograd (fp32 parameters) or the fp32 micro-batch sums (16-bit parameters) hold after
// it, including a parameter used only in an earlier micro-batch and one used twice in a
// backward; 16-bit device gradients are released as they are copied; and the offloaded update
// from streamed gradients is bitwise the update from gradients copied after the backward.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "moe/optim/adamw.h"
#include "moe/optim/offload_gradient_stream.h"

namespace moe::optim {
namespace {

struct Params {
  torch::Tensor a, b, c;  // a: twice per backward; c: only in micro-batch 0
  std::vector<torch::Tensor> all() const { return {a, b, c}; }
};

Params make_params(torch::Dtype dtype) {
  torch::manual_seed(3);
  auto leaf = [&](std::vector<int64_t> shape) {
    return torch::randn(shape).to(dtype).requires_grad_();
  };
  return {leaf({8, 16}), leaf({16, 4}), leaf({8, 4})};
}

// Micro-batch m's loss: x @ a @ b (+ x @ a for a second use of a) (+ x @ c in micro-batch 0).
torch::Tensor loss_of(const Params& p, int m) {
  torch::manual_seed(100 + m);
  const auto x = torch::randn({5, 8}).to(p.a.scalar_type());
  auto h = x.matmul(p.a);
  auto y = h.matmul(p.b) + h.narrow(1, 0, 4);
  if (m == 0) y = y + x.matmul(p.c);
  return y.to(torch::kFloat).pow(2).mean();
}

TEST(OffloadGradientStream, Fp32GradientsEqualAutogradsAfterAccumulation) {
  Params ref = make_params(torch::kFloat), streamed = make_params(torch::kFloat);
  OffloadGradientStream stream(streamed.all(), /*pin_memory=*/true);
  for (int m = 0; m < 3; ++m) {
    loss_of(ref, m).backward();
    stream.begin_backward(m == 2);
    loss_of(streamed, m).backward();
  }
  stream.finish();
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(stream.has_gradient(k)) << k;
    EXPECT_TRUE(torch::equal(stream.host_gradient(k), ref.all()[k].grad())) << k;
  }
}

TEST(OffloadGradientStream, SixteenBitGradientsSummedInFp32AndReleased) {
  Params ref = make_params(torch::kBFloat16), streamed = make_params(torch::kBFloat16);
  std::vector<torch::Tensor> sums(3);
  OffloadGradientStream stream(streamed.all(), true);
  for (int m = 0; m < 3; ++m) {
    loss_of(ref, m).backward();
    for (size_t k = 0; k < 3; ++k) {  // FusedAdamW::accumulate_micro_batch's order
      auto& g = ref.all()[k].mutable_grad();
      if (!g.defined()) continue;
      sums[k] = sums[k].defined() ? sums[k].add_(g) : g.to(torch::kFloat);
      g = torch::Tensor();
    }
    stream.begin_backward(m == 2);
    loss_of(streamed, m).backward();
    for (const auto& p : streamed.all()) EXPECT_FALSE(p.grad().defined()) << "micro-batch " << m;
  }
  stream.finish();
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(stream.has_gradient(k)) << k;
    EXPECT_TRUE(torch::equal(stream.host_gradient(k), sums[k])) << k;
  }
  // Zero bf16 sums would pass the comparison above trivially: they are not.
  EXPECT_GT(stream.host_gradient(0).abs().sum().item<double>(), 0.0);
  stream.clear();
  for (size_t k = 0; k < 3; ++k) EXPECT_FALSE(stream.has_gradient(k));
}

TEST(OffloadGradientStream, HooksRemovedWithTheStream) {
  Params p = make_params(torch::kBFloat16);
  { OffloadGradientStream stream(p.all(), true); }
  loss_of(p, 0).backward();
  for (const auto& t : p.all()) EXPECT_TRUE(t.grad().defined());
}

// Five steps of offloaded AdamW on 16-bit weights: gradients streamed during the backward
// against gradients copied by the update; bitwise the same weights and moments.
TEST(OffloadGradientStream, StreamedUpdateBitwiseEqualsCopiedAfterBackward) {
  Params a = make_params(torch::kBFloat16), b = make_params(torch::kBFloat16);
  OffloadOptions off;
  off.enabled = true;
  FusedAdamW copied({{{"a", "b", "c"}, a.all(), 0.1}}, 0.9, 0.95, 1e-8, off);
  FusedAdamW streamed({{{"a", "b", "c"}, b.all(), 0.1}}, 0.9, 0.95, 1e-8, off);
  streamed.stream_gradients_in_backward();
  ASSERT_TRUE(streamed.streams_gradients());
  for (int step = 0; step < 5; ++step) {
    copied.zero_grad();
    streamed.zero_grad();
    loss_of(a, step % 2).backward();  // odd steps leave c without a gradient
    streamed.begin_backward(true);
    loss_of(b, step % 2).backward();
    streamed.finish_streamed_gradients();
    EXPECT_EQ(streamed.streamed_gradient(b.c).defined(), step % 2 == 0);
    EXPECT_TRUE(streamed.streamed_gradient(b.a).defined());
    copied.step(1e-2);
    streamed.step(1e-2);
  }
  for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(torch::equal(a.all()[k], b.all()[k])) << k;
  auto sa = copied.named_state(), sb = streamed.named_state();
  for (size_t k = 0; k < sa.size(); ++k) {
    EXPECT_TRUE(torch::equal(sa[k].second->exp_avg, sb[k].second->exp_avg)) << sa[k].first;
    EXPECT_TRUE(torch::equal(sa[k].second->step, sb[k].second->step)) << sa[k].first;
  }
  EXPECT_FALSE(torch::equal(a.a, make_params(torch::kBFloat16).a));  // the weights did move
}

}  // namespace
}  // namespace moe::optim
