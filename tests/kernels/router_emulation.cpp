// CPU emulation of the router family's kernels (router_emulation.h): score_and_select's forward
// and backward with the kernel's lane layout and warp-shuffle reduction trees.
#include "router_emulation.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace moe::kernel_emulation {

using namespace kernel_checks;

namespace {

constexpr int kWarp = 32;

// __shfl_xor_sync butterfly sum over 32 lanes: each level adds lane l and lane l ^ o; fp32 add is
// commutative, so every lane ends with the same value, as on the GPU.
float warp_sum(float (&lane)[kWarp]) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    float next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = lane[l] + lane[l ^ o];
    std::memcpy(lane, next, sizeof next);
  }
  return lane[0];
}

}  // namespace

ScoreAndSelectOutputs score_and_select(const ScoreAndSelectInputs& in) {
  auto logits = in.logits.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1), k = in.k;
  const bool normalize = in.normalize && (k > 1 || in.sigmoid);
  const float* lp = logits.data_ptr<float>();
  auto bias = in.bias.defined() ? in.bias.contiguous() : torch::Tensor();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  ScoreAndSelectOutputs out;
  out.probs = torch::full({T, E}, NAN);
  out.topk_idx = torch::full({T, k}, -1, torch::kLong);
  out.topk_weight = torch::full({T, k}, NAN);
  out.lse = torch::full({T}, NAN);
  float* probs = out.probs.data_ptr<float>();
  int64_t* idx = out.topk_idx.data_ptr<int64_t>();
  float* tw = out.topk_weight.data_ptr<float>();
  float* lse = out.lse.data_ptr<float>();

  // router_forward_kernel, one token per "warp": lane l holds experts l, l + 32, ...
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = b; t < end; ++t) {
      const float* v = lp + t * E;
      float m = -FLT_MAX;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, v[e]);
      float lane[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        float s = 0.f;
        for (int64_t e = l; e < E; e += kWarp) s += std::exp(v[e] - m);
        lane[l] = s;
      }
      const float s = warp_sum(lane);
      lse[t] = m + std::log(s);
      for (int64_t e = 0; e < E; ++e) {
        p[static_cast<size_t>(e)] =
            in.sigmoid ? 1.f / (1.f + std::exp(-v[e])) : std::exp(v[e] - m) / s;
        probs[t * E + e] = p[static_cast<size_t>(e)];
      }
      // k rounds of arg-max over keys = scores (+ bias); NaN keys rank lowest; ties -> lower id.
      std::fill(taken.begin(), taken.end(), 0);
      float w[8];
      float wsum = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        float best_key = -INFINITY;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[static_cast<size_t>(e)]) continue;
          float key = bp ? p[static_cast<size_t>(e)] + bp[e] : p[static_cast<size_t>(e)];
          if (std::isnan(key)) key = -INFINITY;
          if (best < 0 || key > best_key) best = e, best_key = key;
        }
        taken[static_cast<size_t>(best)] = 1;
        w[j] = p[static_cast<size_t>(best)];
        wsum += w[j];
        idx[t * k + j] = best;
      }
      const float denom = std::fmax(wsum, 1e-20f);
      for (int64_t j = 0; j < k; ++j) tw[t * k + j] = normalize ? w[j] / denom : w[j];
    }
  });
  out.tokens_per_expert = torch::bincount(out.topk_idx.reshape(-1), {}, E);

  // router_backward_kernel from these outputs and the upstream gradients.
  auto gp_t = in.grad_probs.defined() ? in.grad_probs.contiguous() : torch::Tensor();
  auto gw_t = in.grad_weight.defined() ? in.grad_weight.contiguous() : torch::Tensor();
  auto gl_t = in.grad_lse.defined() ? in.grad_lse.contiguous() : torch::Tensor();
  const float* gpp = gp_t.defined() ? gp_t.data_ptr<float>() : nullptr;
  const float* gwp = gw_t.defined() ? gw_t.data_ptr<float>() : nullptr;
  const float* glp = gl_t.defined() ? gl_t.data_ptr<float>() : nullptr;
  out.grad_logits = torch::empty({T, E});
  float* gout = out.grad_logits.data_ptr<float>();
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
    std::vector<float> g(static_cast<size_t>(E)), gl(static_cast<size_t>(E));
    for (int64_t t = b; t < end; ++t) {
      const float* p = probs + t * E;
      for (int64_t e = 0; e < E; ++e) g[static_cast<size_t>(e)] = gpp ? gpp[t * E + e] : 0.f;
      if (gwp) {
        float dot = 0.f, S = 0.f;
        for (int64_t j = 0; j < k; ++j) {
          dot = std::fma(gwp[t * k + j], tw[t * k + j], dot);
          S += p[idx[t * k + j]];
        }
        S = std::fmax(S, 1e-20f);
        for (int64_t j = 0; j < k; ++j) {
          const float gw = gwp[t * k + j];
          g[static_cast<size_t>(idx[t * k + j])] += normalize ? (gw - dot) / S : gw;
        }
      }
      if (in.sigmoid) {
        for (int64_t e = 0; e < E; ++e) {
          gl[static_cast<size_t>(e)] = g[static_cast<size_t>(e)] * p[e] * (1.f - p[e]);
        }
      } else {
        float lane[kWarp];
        for (int l = 0; l < kWarp; ++l) {
          float d = 0.f;
          for (int64_t e = l; e < E; e += kWarp) d = std::fma(g[static_cast<size_t>(e)], p[e], d);
          lane[l] = d;
        }
        const float dot = warp_sum(lane);
        for (int64_t e = 0; e < E; ++e) {
          gl[static_cast<size_t>(e)] = p[e] * (g[static_cast<size_t>(e)] - dot);
        }
      }
      const float gz = glp ? glp[t] : 0.f, l = lse[t];
      for (int64_t e = 0; e < E; ++e) {
        const float soft = in.sigmoid ? std::exp(lp[t * E + e] - l) : p[e];
        gout[t * E + e] = std::fma(gz, soft, gl[static_cast<size_t>(e)]);
      }
    }
  });
  return out;
}

}  // namespace moe::kernel_emulation
