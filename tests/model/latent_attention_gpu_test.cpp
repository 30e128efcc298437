// Multi-head latent attention (DeepSeek-V2/V3) on a GPU (label `gpu`, in moe_gpu_tests; skipped
// without a device). The CPU module is the reference (tests/hf/deepseek_test.py holds it to
// transformers within 2.4e-7):
//  - the same module (same seed, same weights) on CUDA in fp32 gives the CPU's output and every
//    parameter's gradient within TF32 rounding, with a query bottleneck and without, interleaved
//    rotary pairs and YaRN's mscale softmax scale on (a wrong scale or rotation moves the output
//    by tenths of its magnitude);
//  - in bf16 (the training dtype) at DeepSeek-V3's head widths (q/k 192, v 128) over 8192 tokens,
//    forward + backward stay far below the [H, S, S] scores' size: torch's memory-efficient SDPA
//    kernel takes the unequal widths (memory linear in S); the math fallback would need 2 GiB.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "moe/model/transformer.h"

namespace moe::model {
namespace {

AttentionOptions latent_options(int64_t hidden, int64_t heads, int64_t q_lora, int64_t kv_lora,
                                int64_t nope, int64_t rope, int64_t v) {
  AttentionOptions a;
  a.hidden = hidden;
  a.heads = a.kv_heads = heads;
  a.rope_theta = 10000;
  a.rope_scaling.type = config::RopeScalingType::kYarn;
  a.rope_scaling.factor = 40;
  a.rope_scaling.original_max_position_embeddings = 4096;
  a.rope_scaling.mscale_all_dim = 1.0;
  a.kv_lora_rank = kv_lora;
  a.q_lora_rank = q_lora;
  a.qk_nope_head_dim = nope;
  a.qk_rope_head_dim = rope;
  a.v_head_dim = v;
  a.rope_interleave = true;
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  a.softmax_scale = std::pow(static_cast<double>(nope + rope), -0.5) * mscale * mscale;
  return a;
}

class LatentAttentionGpu : public ::testing::TestWithParam<int64_t> {};  // q_lora_rank

TEST_P(LatentAttentionGpu, CudaMatchesTheCpuModuleInValuesAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const AttentionOptions opt = latent_options(128, 4, GetParam(), 48, 32, 16, 24);
  torch::manual_seed(5);
  CausalSelfAttention cpu(opt);
  torch::manual_seed(5);
  CausalSelfAttention gpu(opt);
  gpu->to(torch::kCUDA);
  const int64_t B = 2, S = 96;
  const auto x = torch::randn({B, S, opt.hidden});
  const auto w = torch::randn({B, S, opt.hidden});
  const auto y_cpu = cpu->forward(x);
  (y_cpu * w).sum().backward();
  const auto y_gpu = gpu->forward(x.to(torch::kCUDA));
  (y_gpu * w.to(torch::kCUDA)).sum().backward();
  // SDPA's fp32 CUDA kernels and cuBLAS may multiply in TF32 (10-bit mantissas): 2^-9 of the
  // largest magnitude.
  auto close = [](const torch::Tensor& ref, const torch::Tensor& got, const std::string& what) {
    const double scale = ref.abs().max().item<double>();
    const double diff = (ref - got.to(torch::kCPU)).abs().max().item<double>();
    EXPECT_LE(diff, 2e-3 * std::max(1.0, scale)) << what << " (max |ref| " << scale << ")";
  };
  close(y_cpu, y_gpu, "output");
  const auto cpu_params = cpu->named_parameters(), gpu_params = gpu->named_parameters();
  ASSERT_EQ(cpu_params.size(), gpu_params.size());
  for (const auto& p : cpu_params) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    close(p.value().grad(), gpu_params[p.key()].grad(), "grad " + p.key());
  }
}

INSTANTIATE_TEST_SUITE_P(QueryBottleneck, LatentAttentionGpu, ::testing::Values(0, 40),
                         [](const ::testing::TestParamInfo<int64_t>& i) {
                           return i.param > 0 ? std::string("q_lora") : std::string("q_proj");
                         });

TEST(LatentAttentionGpuMemory, LinearInTheSequenceAtDeepSeekV3HeadWidths) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // DeepSeek-V3's head widths (nope 128 + rope 64, v 128) and latents (1536, 512), 16 heads.
  const AttentionOptions opt = latent_options(2048, 16, 1536, 512, 128, 64, 128);
  torch::manual_seed(5);
  CausalSelfAttention attn(opt);
  attn->to(torch::kCUDA, torch::kBFloat16);
  const int64_t S = 8192;
  const auto x =
      torch::randn({1, S, opt.hidden}, torch::dtype(torch::kBFloat16).device(torch::kCUDA))
          .requires_grad_(true);
  torch::cuda::synchronize();
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t before =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  attn->forward(x).sum().backward();
  torch::cuda::synchronize();
  const int64_t peak =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[agg].peak - before;
  const int64_t scores = 16 * S * S * 2;  // one [H, S, S] bf16 tensor: 2 GiB
  EXPECT_LT(peak, scores / 4) << "forward + backward peaked at " << peak / (1 << 20)
                              << " MiB above the inputs; the scores alone are "
                              << scores / (1 << 20) << " MiB";
  std::printf("latent attention, S %lld, bf16: forward + backward peak %lld MiB above the inputs\n",
              static_cast<long long>(S), static_cast<long long>(peak >> 20));
}

}  // namespace
}  // namespace moe::model
