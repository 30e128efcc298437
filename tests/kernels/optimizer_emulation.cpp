#include "optimizer_emulation.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "moe/quant/blockwise_quant.h"

namespace moe::kernel_emulation {

namespace {

constexpr int kBlock = 256;

uint8_t nearest_code(float x, const std::array<float, kBlock - 1>& bounds) {
  int lo = 0, hi = kBlock - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (bounds[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint8_t>(lo);
}

}  // namespace

kernel_checks::Adam8bitOutputs adam8bit_step(const kernel_checks::Adam8bitInputs& in) {
  const kernels::Adam8bitScalars s = kernel_checks::adam8bit_scalars(in);
  const auto smap_t = quant::dynamic_map(true, torch::kCPU);
  const auto umap_t = quant::dynamic_map(false, torch::kCPU);
  const float* smap = smap_t.data_ptr<float>();
  const float* umap = umap_t.data_ptr<float>();
  std::array<float, kBlock - 1> sbound{}, ubound{};
  for (int k = 0; k < kBlock - 1; ++k) {
    sbound[k] = (smap[k] + smap[k + 1]) / 2.0f;
    ubound[k] = (umap[k] + umap[k + 1]) / 2.0f;
  }
  kernel_checks::Adam8bitOutputs out{in.param.cpu().clone(), in.m_codes.cpu().clone(),
                                     in.m_absmax.cpu().clone(), in.v_codes.cpu().clone(),
                                     in.v_absmax.cpu().clone()};
  const auto grad_t = in.grad.cpu().contiguous();
  const float* grad = grad_t.data_ptr<float>();
  float* param = out.param.data_ptr<float>();
  uint8_t* m_codes = out.m_codes.data_ptr<uint8_t>();
  uint8_t* v_codes = out.v_codes.data_ptr<uint8_t>();
  float* m_absmax = out.m_absmax.data_ptr<float>();
  float* v_absmax = out.v_absmax.data_ptr<float>();
  const int64_t n = in.param.numel();
  const int64_t blocks = quant::quant_blocks(n);
  for (int64_t b = 0; b < blocks; ++b) {
    std::array<float, kBlock> m{}, v{};  // out-of-range threads hold 0
    for (int tid = 0; tid < kBlock; ++tid) {
      const int64_t i = b * kBlock + tid;
      if (i >= n) continue;
      float g = grad[i];
      if (s.grad_scale != 1.0f) g = g / s.grad_scale;
      float mi = smap[m_codes[i]] * m_absmax[b];
      float vi = umap[v_codes[i]] * v_absmax[b];
      mi = std::fma(g, s.one_minus_beta1, mi * s.beta1);
      vi = vi * s.beta2 + (s.one_minus_beta2 * g) * g;
      const float denom = std::sqrt(vi) / s.correction2 + s.eps;
      float p = param[i];
      if (s.weight_decay) p = p * s.decay;
      param[i] = p + (s.step_size * mi) / denom;
      m[tid] = mi;
      v[tid] = vi;
    }
    float amax_m = 0.0f, amax_v = 0.0f;  // max is order-free: the kernel's tree gives the same
    for (int tid = 0; tid < kBlock; ++tid) {
      amax_m = std::max(amax_m, std::fabs(m[tid]));
      amax_v = std::max(amax_v, std::fabs(v[tid]));
    }
    m_absmax[b] = amax_m;
    v_absmax[b] = amax_v;
    const float rm = 1.0f / std::max(amax_m, 1e-38f), rv = 1.0f / std::max(amax_v, 1e-38f);
    for (int tid = 0; tid < kBlock; ++tid) {
      const int64_t i = b * kBlock + tid;
      if (i >= n) continue;
      m_codes[i] = nearest_code(std::clamp(m[tid] * rm, -1.0f, 1.0f), sbound);
      v_codes[i] = nearest_code(std::clamp(v[tid] * rv, -1.0f, 1.0f), ubound);
    }
  }
  return out;
}

}  // namespace moe::kernel_emulation
