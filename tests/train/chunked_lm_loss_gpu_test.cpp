// The chunked LM head + cross-entropy on a GPU under bf16 autocast (label `gpu`, in
// moe_gpu_tests; skipped without a device): the same loss and gradients as the whole head within
// bf16 rounding, and a lower allocator peak (no [tokens, vocab] logits kept).
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include "moe/train/chunked_lm_loss.h"
#include "moe/train/loss_targets.h"

namespace moe::train {
namespace {

int64_t peak_allocated() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

double rel(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max() /
          want.to(torch::kDouble).abs().max().clamp_min(1e-30))
      .item<double>();
}

TEST(ChunkedLmLossGpu, MatchesTheWholeHeadUnderBf16WithALowerPeak) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 4096, d = 256, V = 32000;
  torch::manual_seed(9);
  const auto opts = torch::TensorOptions(torch::kCUDA);
  const auto h0 = torch::randn({N, d}, opts);
  const auto w0 = torch::randn({V, d}, opts) * 0.05;
  LossTargets t;
  t.targets = torch::randint(0, V, {N}, opts.dtype(torch::kLong));
  t.targets.index_put_({torch::arange(0, N, 7, opts.dtype(torch::kLong))}, kIgnoredTarget);
  t.keep = t.targets.ne(kIgnoredTarget);
  t.count = t.keep.sum().to(torch::kFloat);

  struct Run {
    torch::Tensor loss, gh, gw;
    int64_t peak;
  };
  auto run = [&](int64_t chunk) {
    auto h = h0.clone().requires_grad_(true);
    auto w = w0.clone().requires_grad_(true);
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const int64_t before = peak_allocated();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, torch::kBFloat16);
    torch::Tensor loss =
        chunk > 0 ? chunked_lm_loss(h, w, t, chunk)
                  : masked_lm_loss(torch::nn::functional::linear(h, w).to(torch::kFloat), t);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    loss.backward();
    torch::cuda::synchronize();
    return Run{loss.detach(), h.grad(), w.grad(), peak_allocated() - before};
  };
  const Run whole = run(0);
  const Run chunked = run(512);
  EXPECT_LT(rel(chunked.loss, whole.loss), 1e-3);
  EXPECT_LT(rel(chunked.gh, whole.gh), 2e-2);
  EXPECT_LT(rel(chunked.gw, whole.gw), 2e-2);
  // The whole head keeps [N, V] logits in bf16 and fp32 (and more in its backward): 393 MB+;
  // the chunked one a [512, V] chunk and the two gradients (~36 MB).
  const int64_t logits_fp32 = N * V * 4;
  EXPECT_LT(chunked.peak + logits_fp32, whole.peak)
      << "chunked peak " << chunked.peak << " B, whole " << whole.peak << " B";
}

}  // namespace
}  // namespace moe::train
