// attention_sdpa on a GPU (label `gpu`, in moe_gpu_tests; skipped without a device): gpt-oss's
// sinks and sliding windows folded into torch's SDPA kernels must give the eager reference's
// values and q/k/v/sink gradients. fp32: the efficient/math kernels against the reference on
// the same device, within TF32 rounding. bf16 (the training dtype: flash or cuDNN with the padded
// head dim and the dummy query row): against the fp32 reference of the same bf16-rounded inputs,
// within bf16's rounding of the outputs; a sink left out or a window off by one moves outputs by
// tenths (the sinks here are N(0, 2) logits, the window 8 of 96 keys), far past that bound.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "moe/model/attention_core.h"

namespace moe::model {
namespace {

struct GpuCase {
  bool sinks;
  int64_t window;
  bool documents;
  int64_t head_dim;  // 64: gpt-oss's; 48: a head dim SDPA's fast kernels take only when padded
};

torch::Tensor documents_mask(int64_t B, int64_t S, const torch::Device& d) {
  auto doc = torch::zeros({B, S}, torch::kLong);
  doc[1].narrow(0, 30, S - 30).fill_(1);
  doc[1].narrow(0, 61, S - 61).fill_(2);
  const auto causal = torch::ones({S, S}, torch::kBool).tril();
  return (doc.unsqueeze(2).eq(doc.unsqueeze(1)) & causal).unsqueeze(1).to(d);
}

// Output and the gradients of q, k, v (and the sinks) of (y * weights).sum().
std::vector<torch::Tensor> run(bool sdpa, const std::vector<torch::Tensor>& in, const GpuCase& c,
                               const torch::Tensor& documents, const torch::Tensor& weights) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : in) leaves.push_back(t.detach().clone().requires_grad_(true));
  const AttentionMasking m{documents, c.window, c.sinks ? leaves[3] : torch::Tensor()};
  const auto y = sdpa ? attention_sdpa(leaves[0], leaves[1], leaves[2], m, 0.0)
                      : attention_reference(leaves[0], leaves[1], leaves[2], m, 0.0);
  std::vector<torch::Tensor> wrt(leaves.begin(), leaves.begin() + (c.sinks ? 4 : 3));
  auto out = torch::autograd::grad({(y.to(torch::kFloat) * weights).sum()}, wrt);
  out.insert(out.begin(), y.detach());
  for (auto& t : out) t = t.to(torch::kFloat);
  return out;
}

class AttentionCoreGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(AttentionCoreGpu, SdpaMatchesTheReferenceInValuesAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const GpuCase c = GetParam();
  const torch::Device cuda(torch::kCUDA);
  const int64_t B = 2, H = 4, S = 96, hd = c.head_dim;
  torch::manual_seed(17);
  std::vector<torch::Tensor> in{torch::randn({B, H, S, hd}), torch::randn({B, H, S, hd}),
                                torch::randn({B, H, S, hd}), torch::randn({H}) * 2};
  for (auto& t : in) t = t.to(cuda);
  const auto weights = torch::randn({B, H, S, hd}).to(cuda);
  const auto documents = c.documents ? documents_mask(B, S, cuda) : torch::Tensor();
  const std::vector<std::string> names{"output", "grad q", "grad k", "grad v", "grad sinks"};
  {  // fp32 on the device: the same math; SDPA's fp32 kernels may multiply in TF32 (10-bit
     // mantissas) where the reference's matmuls do not: 2^-9 of the largest magnitude
    const auto ref = run(false, in, c, documents, weights);
    const auto got = run(true, in, c, documents, weights);
    for (size_t i = 0; i < ref.size(); ++i) {
      const double scale = ref[i].abs().max().item<double>();
      const double diff = (ref[i] - got[i]).abs().max().item<double>();
      EXPECT_LE(diff, 2e-3 * std::max(1.0, scale)) << "fp32 " << names[i];
    }
  }
  {  // bf16 inputs (sinks stay fp32 parameters): the fast kernels
    std::vector<torch::Tensor> lo = in, hi = in;
    for (int i = 0; i < 3; ++i) {
      lo[i] = in[i].to(torch::kBFloat16);
      hi[i] = lo[i].to(torch::kFloat);  // the reference sees the same rounded values
    }
    const auto ref = run(false, hi, c, documents, weights);
    const auto got = run(true, lo, c, documents, weights);
    for (size_t i = 0; i < ref.size(); ++i) {
      const double scale = ref[i].abs().max().item<double>();
      const double diff = (ref[i] - got[i]).abs().max().item<double>();
      // bf16 keeps 8 significant bits: outputs and gradients rounded once (2^-8 relative) plus
      // the kernels' bf16 probabilities in the value sums: 4 x 2^-8 of the largest magnitude.
      EXPECT_LE(diff, 4.0 / 256 * std::max(1.0, scale)) << "bf16 " << names[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, AttentionCoreGpu,
                         ::testing::Values(GpuCase{true, 0, false, 64}, GpuCase{true, 8, false, 64},
                                           GpuCase{false, 8, false, 64}, GpuCase{true, 0, true, 64},
                                           GpuCase{true, 8, true, 48},
                                           GpuCase{false, 0, false, 48}),
                         [](const ::testing::TestParamInfo<GpuCase>& i) {
                           const GpuCase& c = i.param;
                           return std::string(c.sinks ? "sinks" : "nosinks") + "_w" +
                                  std::to_string(c.window) + (c.documents ? "_docs" : "") + "_hd" +
                                  std::to_string(c.head_dim);
                         });

}  // namespace
}  // namespace moe::model
