// CPU emulation of the router family's kernels (router_emulation.h): score_and_select's forward
// and backward with the kernel's lane layout and warp-shuffle reduction trees.
#include "router_emulation.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
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

// An arg-max candidate of one lane: a key and its id (kNone: no candidate).
constexpr int kNone = INT_MAX;
struct Candidate {
  float key = -INFINITY;
  int id = kNone;
};

// router.cu warp_argmax's order (keys never NaN): the larger key, equal keys to the lower id.
bool expert_beats(const Candidate& c2, const Candidate& c, const RouterMutation& m) {
  if (c2.id == kNone) return false;
  if (c.id == kNone) return true;
  const bool id_wins = m.expert_ties_to_higher_id ? c2.id > c.id : c2.id < c.id;
  return c2.key > c.key || (c2.key == c.key && id_wins);
}

// router.cu group_beats: at::sort's descending order, NaN above everything, equal keys (or two
// NaN) to the lower group id.
bool group_beats(const Candidate& c2, const Candidate& c, const RouterMutation& m) {
  if (c2.id == kNone) return false;
  if (c.id == kNone) return true;
  const bool n2 = std::isnan(c2.key), n1 = std::isnan(c.key);
  if (n2 != n1) return m.nan_group_keys_last ? n1 : n2;
  const bool id_wins = m.group_ties_to_higher_id ? c2.id > c.id : c2.id < c.id;
  return c2.key > c.key || ((n2 || c2.key == c.key) && id_wins);
}

// The __shfl_xor_sync butterfly of an arg-max: at each level lane l takes lane l ^ o's candidate
// when it beats its own.
template <class Beats>
Candidate warp_argmax(Candidate (&lane)[kWarp], const Beats& beats) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    Candidate next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = beats(lane[l ^ o], lane[l]) ? lane[l ^ o] : lane[l];
    std::copy(next, next + kWarp, lane);
  }
  return lane[0];
}

// router.cu keep_best_groups over one token's keys [E] (lane l holds experts l, l + 32, ...):
// each group's key from one or two arg-max rounds restricted to it (b1 + b2), lane g holding
// group g's key, topk_group arg-max rounds over those lanes, the other groups' keys -> -inf.
void keep_best_groups(float* key, int E, int n_group, int topk_group, int scored,
                      const RouterMutation& m) {
  const int S = E / n_group;
  auto expert = [&](const Candidate& a, const Candidate& b) { return expert_beats(a, b, m); };
  auto group = [&](const Candidate& a, const Candidate& b) { return group_beats(a, b, m); };
  float group_key_of_lane[kWarp];
  std::fill(group_key_of_lane, group_key_of_lane + kWarp, -INFINITY);
  const int rounds = m.group_key_best_only ? 1 : scored;
  for (int g = 0; g < n_group; ++g) {
    const int lo = g * S, hi = lo + S;
    float group_key = 0.f;
    int first = kNone;
    for (int r = 0; r < rounds; ++r) {
      Candidate lane[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        for (int e = l; e < E; e += kWarp) {
          const Candidate c{key[e], e};
          if (e >= lo && e < hi && e != first && expert(c, lane[l])) lane[l] = c;
        }
      }
      const Candidate best = warp_argmax(lane, expert);
      group_key = r == 0 ? best.key : group_key + best.key;
      if (!m.group_key_best_twice) first = best.id;
    }
    group_key_of_lane[g] = group_key;
  }
  uint32_t kept = 0;
  for (int j = 0; j < topk_group; ++j) {
    Candidate lane[kWarp];
    for (int l = 0; l < kWarp; ++l) {
      lane[l] = {group_key_of_lane[l], l < n_group && !((kept >> l) & 1u) ? l : kNone};
    }
    kept |= 1u << warp_argmax(lane, group).id;
  }
  for (int e = 0; e < E; ++e) {
    if (!((kept >> (e / S)) & 1u)) key[e] = -INFINITY;
  }
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> select_experts(const torch::Tensor& probs_in,
                                                       const ScoreAndSelectInputs& in,
                                                       const RouterMutation& mutation) {
  const auto probs_t = probs_in.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const int64_t T = probs_t.size(0), E = probs_t.size(1), k = in.k;
  const bool normalize = in.normalize && (k > 1 || in.sigmoid);
  const float* probs = probs_t.data_ptr<float>();
  auto bias = in.bias.defined() ? in.bias.to(torch::kCPU).contiguous() : torch::Tensor();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  auto topk_idx = torch::full({T, k}, -1, torch::kLong);
  auto topk_weight = torch::full({T, k}, NAN);
  int64_t* idx = topk_idx.data_ptr<int64_t>();
  float* tw = topk_weight.data_ptr<float>();
  const RouterMutation& m = mutation;
  auto expert = [&](const Candidate& a, const Candidate& b) { return expert_beats(a, b, m); };
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
    std::vector<float> key(static_cast<size_t>(E));
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = b; t < end; ++t) {
      const float* p = probs + t * E;
      // Keys = scores (+ bias); NaN keys rank lowest (-inf).
      for (int64_t e = 0; e < E; ++e) {
        float key_e = bp ? p[e] + bp[e] : p[e];
        if (std::isnan(key_e)) key_e = -INFINITY;
        key[static_cast<size_t>(e)] = key_e;
      }
      if (in.n_group > 1) {
        keep_best_groups(key.data(), static_cast<int>(E), static_cast<int>(in.n_group),
                         static_cast<int>(in.topk_group), static_cast<int>(in.group_score_experts),
                         m);
      }
      // k rounds of warp arg-max; ties -> lower id.
      std::fill(taken.begin(), taken.end(), 0);
      float w[8];
      float wsum = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        Candidate lane[kWarp];
        for (int l = 0; l < kWarp; ++l) {
          for (int64_t e = l; e < E; e += kWarp) {
            const Candidate c{key[static_cast<size_t>(e)], static_cast<int>(e)};
            if (!taken[static_cast<size_t>(e)] && expert(c, lane[l])) lane[l] = c;
          }
        }
        const int best = warp_argmax(lane, expert).id;
        taken[static_cast<size_t>(best)] = 1;
        w[j] = p[best];
        wsum += w[j];
        idx[t * k + j] = best;
      }
      // clamp_min(1e-20) of the reference keeps a NaN sum.
      const float denom = std::isnan(wsum) ? wsum : std::fmax(wsum, 1e-20f);
      for (int64_t j = 0; j < k; ++j) tw[t * k + j] = normalize ? w[j] / denom : w[j];
    }
  });
  return {topk_idx, topk_weight};
}

ScoreAndSelectOutputs score_and_select(const ScoreAndSelectInputs& in,
                                       const RouterMutation& mutation) {
  auto logits = in.logits.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1), k = in.k;
  const bool normalize = in.normalize && (k > 1 || in.sigmoid);
  const float* lp = logits.data_ptr<float>();
  ScoreAndSelectOutputs out;
  out.probs = torch::full({T, E}, NAN);
  out.lse = torch::full({T}, NAN);
  float* probs = out.probs.data_ptr<float>();
  float* lse = out.lse.data_ptr<float>();

  // router_forward_kernel, one token per "warp": lane l holds experts l, l + 32, ...
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
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
        probs[t * E + e] = in.sigmoid ? 1.f / (1.f + std::exp(-v[e])) : std::exp(v[e] - m) / s;
      }
    }
  });
  // The selection, from those scores.
  std::tie(out.topk_idx, out.topk_weight) = select_experts(out.probs, in, mutation);
  const int64_t* idx = out.topk_idx.data_ptr<int64_t>();
  const float* tw = out.topk_weight.data_ptr<float>();
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
