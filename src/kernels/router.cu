// The router family's kernels and raw launches (detail::score_and_select_forward/backward;
// autograd op in router_ops.cpp): logits -> scores -> top-k -> gate weights -> counts and
// logsumexp, and its backward.
//
// Layout: kernels, then checked launchers, then tensor-level wrappers. One warp per token; lane l
// holds experts l, l + 32, ... in registers (E <= 256).
//
// Bytes that bound it (T tokens, E experts, k slots, fp32 logits):
//   forward:  read T*E*4 (+ E*4 bias), write T*E*4 (probs) + T*k*12 (ids, weights) + T*4 (lse)
//   backward: read 2*T*E*4 (logits, probs) + T*k*12 + T*E*4 (grad_probs, when the aux loss
//             needs it), write T*E*4
// Counts use integer atomics: the sum does not depend on the order, so results are deterministic.
// Ties: the larger score wins; equal scores go to the lower expert id (as the stable sort of the
// reference).
// Group-limited selection (n_group > 1, DeepSeek-V3 / DeepSeek-V2): keep_best_groups below, the
// same groups, group keys and tie rules as the reference's keep_best_groups (src/moe/router.cpp).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cfloat>
#include <climits>

#include "device_helpers.cuh"
#include "moe/kernels/kernel_args.h"
#include "moe/kernels/router.h"

namespace moe::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 8;  // E <= 256
static_assert(kWarp * kMaxPerLane == moe::kernels::kRouterKernelMaxExperts);
constexpr int kMaxTopK = 8;
static_assert(kMaxTopK == moe::kernels::kRouterKernelMaxTopK);
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Arg-max over the warp: larger key wins, equal keys go to the lower id; id INT_MAX is "no
// candidate" and loses to any real one, whatever its key (keys are never NaN: see below).
__device__ __forceinline__ void warp_argmax(float& key, int& id) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    if (i2 != INT_MAX && (id == INT_MAX || k2 > key || (k2 == key && i2 < id))) {
      key = k2;
      id = i2;
    }
  }
}

// The order of at::sort(descending, stable) over group keys: larger first, NaN above everything
// (a group key is NaN only when +inf and -inf keys meet in its sum: an infinite bias), equal keys
// by lower id. Candidate (k2, i2) beats (key, id); id INT_MAX is "no candidate".
__device__ __forceinline__ bool group_beats(float k2, int i2, float key, int id) {
  if (i2 == INT_MAX) return false;
  if (id == INT_MAX) return true;
  const bool n2 = isnan(k2), n1 = isnan(key);
  if (n2 != n1) return n2;
  return k2 > key || ((n2 || k2 == key) && i2 < id);
}

__device__ __forceinline__ void warp_argmax_groups(float& key, int& id) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    if (group_beats(k2, i2, key, id)) {
      key = k2;
      id = i2;
    }
  }
}

// Group-limited selection (n_group > 1): group g holds experts [g S, (g + 1) S), S = E / n_group.
// Its key is its best expert key (a warp arg-max restricted to the group) plus, with scored == 2,
// the best of the rest (a second one, the first winner's id excluded): b1 + b2, the sum of
// at::topk(2)'s two values. Lane g then holds group g's key (n_group <= 32), and topk_group rounds
// of warp arg-max over those lanes keep the best groups (ties -> lower group id). The experts of
// the other groups get key -inf: they stay candidates of the k rounds, behind every larger key,
// ties -> lower id, as in the reference's masked_fill. `key` holds no NaN (see the caller).
__device__ __forceinline__ void keep_best_groups(float (&key)[kMaxPerLane], int lane, int E,
                                                 int n_group, int topk_group, int scored) {
  const int S = E / n_group;
  float my_group_key = -INFINITY;  // lane g < n_group: group g's key
  for (int g = 0; g < n_group; ++g) {
    const int lo = g * S, hi = lo + S;
    float group_key = 0.f;
    int first = INT_MAX;  // round 1's winner, excluded from round 2
    for (int r = 0; r < scored; ++r) {
      float best = -INFINITY;
      int id = INT_MAX;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int e = lane + i * kWarp;
        if (e >= lo && e < hi && e != first &&
            (id == INT_MAX || key[i] > best || (key[i] == best && e < id))) {
          best = key[i];
          id = e;
        }
      }
      warp_argmax(best, id);
      group_key = r == 0 ? best : group_key + best;
      first = id;
    }
    if (lane == g) my_group_key = group_key;
  }
  unsigned kept = 0;  // the same on every lane
  for (int j = 0; j < topk_group; ++j) {
    float gk = my_group_key;
    int gid = lane < n_group && !((kept >> lane) & 1u) ? lane : INT_MAX;
    warp_argmax_groups(gk, gid);
    kept |= 1u << gid;  // topk_group <= n_group: a group is left for every round
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < E && !((kept >> (e / S)) & 1u)) key[i] = -INFINITY;
  }
}

// The selection keys of this lane's experts: scores (+ bias). A diverging step can bring NaN
// scores: they rank lowest (-inf), so every round of the selection still picks a real expert
// (k <= E) and no id is ever out of range; the NaN weights then make the loss NaN and the trainer
// skips the step, as on the reference path.
__device__ __forceinline__ void selection_keys(const float (&p)[kMaxPerLane],
                                               const float* __restrict__ bias, int lane, int E,
                                               float (&keys)[kMaxPerLane]) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    float key_e = -INFINITY;
    if (e < E) {
      key_e = bias != nullptr ? p[i] + bias[e] : p[i];
      if (isnan(key_e)) key_e = -INFINITY;
    }
    keys[i] = key_e;
  }
}

// This lane's best expert not yet `taken` (bit i: slot i won an earlier round): the largest key,
// ties -> lower id; id INT_MAX when the lane has none. The warp arg-max then picks among lanes.
__device__ __forceinline__ void lane_best_untaken(const float (&keys)[kMaxPerLane], unsigned taken,
                                                  int lane, int E, float& key, int& id) {
  key = -INFINITY;
  id = INT_MAX;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < E && !((taken >> i) & 1u)) {
      if (id == INT_MAX || keys[i] > key || (keys[i] == key && e < id)) {
        key = keys[i];
        id = e;
      }
    }
  }
}

// ---- kernels ----------------------------------------------------------------------------

template <bool kSigmoid>
__global__ void router_forward_kernel(const float* __restrict__ logits,
                                      const float* __restrict__ bias, int64_t T, int E, int k,
                                      bool normalize, int n_group, int topk_group,
                                      int group_score_experts, float* __restrict__ probs,
                                      int64_t* __restrict__ topk_idx,
                                      float* __restrict__ topk_weight, float* __restrict__ lse,
                                      int* __restrict__ counts) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= T) return;  // whole warps exit together: t is uniform within a warp
  const float* row = logits + t * E;
  float v[kMaxPerLane], p[kMaxPerLane];
  float m = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    v[i] = e < E ? row[e] : -FLT_MAX;
    m = fmaxf(m, v[i]);
  }
  m = warp_max(m);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (lane + i * kWarp < E) s += expf(v[i] - m);
  }
  s = warp_sum(s);
  if (lane == 0) lse[t] = m + logf(s);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < E) {
      p[i] = kSigmoid ? 1.f / (1.f + expf(-v[i])) : expf(v[i] - m) / s;
      probs[t * E + e] = p[i];
    } else {
      p[i] = 0.f;
    }
  }
  // The selection keys: scores (+ bias), NaN ranked lowest (selection_keys).
  float keys[kMaxPerLane];
  selection_keys(p, bias, lane, E, keys);
  if (n_group > 1) keep_best_groups(keys, lane, E, n_group, topk_group, group_score_experts);
  // k rounds of warp arg-max over the keys; `taken` marks winners.
  unsigned taken = 0;
  float w[kMaxTopK];
  float wsum = 0.f;
  for (int j = 0; j < k; ++j) {
    float key;
    int id;
    lane_best_untaken(keys, taken, lane, E, key, id);
    warp_argmax(key, id);
    const int owner = id % kWarp, slot = id / kWarp;
    float mine = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i == slot) mine = p[i];
    }
    const float score = __shfl_sync(0xffffffffu, mine, owner);  // the unbiased score
    if (lane == owner) taken |= 1u << slot;
    w[j] = score;
    wsum += score;  // j = 0..k-1 in order, as the reference's sum over the k weights
    if (lane == 0) {
      topk_idx[t * k + j] = id;
      atomicAdd(counts + id, 1);
    }
  }
  if (lane == 0) {
    // clamp_min(1e-20) of the reference: a NaN sum stays NaN (fmaxf would drop it).
    const float denom = isnan(wsum) ? wsum : fmaxf(wsum, 1e-20f);
    for (int j = 0; j < k; ++j) topk_weight[t * k + j] = normalize ? w[j] / denom : w[j];
  }
}

template <bool kSigmoid>
__global__ void router_backward_kernel(
    const float* __restrict__ logits, const float* __restrict__ probs,
    const int64_t* __restrict__ topk_idx, const float* __restrict__ topk_weight,
    const float* __restrict__ lse, const float* __restrict__ grad_probs,
    const float* __restrict__ grad_weight, const float* __restrict__ grad_lse, int64_t T, int E,
    int k, bool normalize, float* __restrict__ grad_logits) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= T) return;
  float p[kMaxPerLane], g[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < E ? probs[t * E + e] : 0.f;
    g[i] = (e < E && grad_probs != nullptr) ? grad_probs[t * E + e] : 0.f;
  }
  // Gate weights w_j = p[i_j] / S (S = sum_j p[i_j]) when normalised, else p[i_j]:
  //   dL/dp[i_m] += (gw_m - sum_j gw_j w_j) / S,   or gw_m.
  if (grad_weight != nullptr) {
    float dot = 0.f, S = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t id = topk_idx[t * k + j];
      MOE_DEVICE_ASSERT(id >= 0 && id < E);
      dot += grad_weight[t * k + j] * topk_weight[t * k + j];
      if (id >= 0 && id < E) S += probs[t * E + id];  // an invalid id adds nothing
    }
    S = fmaxf(S, 1e-20f);
    for (int j = 0; j < k; ++j) {
      const int64_t id = topk_idx[t * k + j];
      const int e = id >= 0 && id < E ? static_cast<int>(id) : -1;  // -1 matches no lane
      const float gw = grad_weight[t * k + j];
      const float add = normalize ? (gw - dot) / S : gw;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        if (lane + i * kWarp == e) g[i] += add;
      }
    }
  }
  float gl[kMaxPerLane];
  if (kSigmoid) {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) gl[i] = g[i] * p[i] * (1.f - p[i]);
  } else {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) dot += g[i] * p[i];
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) gl[i] = p[i] * (g[i] - dot);
  }
  // z-loss path: d lse / d logit_e = softmax_e = exp(logit_e - lse).
  const float gz = grad_lse != nullptr ? grad_lse[t] : 0.f;
  const float l = lse[t];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < E) {
      const float soft = kSigmoid ? expf(logits[t * E + e] - l) : p[i];
      grad_logits[t * E + e] = gl[i] + gz * soft;
    }
  }
}

// ---- checked launchers -------------------------------------------------------------------

void check_logits(const at::Tensor& logits) {
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kFloat && logits.dim() == 2,
              "moe router kernel: logits must be a 2-D fp32 CUDA tensor, got ",
              logits.scalar_type(), " ", logits.sizes(), " on ", logits.device());
  TORCH_CHECK(logits.size(1) >= 1 && logits.size(1) <= kWarp * kMaxPerLane,
              "moe router kernel: num_experts = ", logits.size(1), " must be in [1, ",
              kWarp * kMaxPerLane, "]");
}

int64_t grid_for(int64_t T) {
  const int64_t blocks = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  check_grid(blocks, T, "router");
  return blocks;
}

}  // namespace

namespace detail {

ScoreAndSelectOutput score_and_select_forward(const at::Tensor& logits_in, const at::Tensor& bias,
                                              int64_t top_k, bool sigmoid_scores,
                                              bool normalize_topk, bool poison, int64_t n_group,
                                              int64_t topk_group, int64_t group_score_experts) {
  check_logits(logits_in);
  const at::Tensor logits = logits_in.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= std::min<int64_t>(E, kMaxTopK),
              "moe router kernel: top_k = ", top_k, " must be in [1, min(num_experts = ", E, ", ",
              kMaxTopK, ")]");
  TORCH_CHECK(n_group >= 1 && n_group <= kWarp, "moe router kernel: n_group = ", n_group,
              " must be in [1, ", kWarp, "] (more groups: the ATen form)");
  if (n_group > 1) {
    TORCH_CHECK(E % n_group == 0, "moe router kernel: n_group = ", n_group,
                " must divide num_experts = ", E);
    TORCH_CHECK(topk_group >= 1 && topk_group <= n_group,
                "moe router kernel: topk_group = ", topk_group,
                " must be in [1, n_group = ", n_group, "]");
    TORCH_CHECK((group_score_experts == 1 || group_score_experts == 2) &&
                    group_score_experts <= E / n_group,
                "moe router kernel: group_score_experts = ", group_score_experts,
                " must be 1 or 2 and at most the experts per group (", E / n_group, ")");
  }
  at::Tensor b;
  if (bias.defined()) {
    TORCH_CHECK(bias.is_cuda() && bias.scalar_type() == at::kFloat && bias.numel() == E,
                "moe router kernel: expert bias must be [", E, "] fp32 on the logits' device, got ",
                bias.scalar_type(), " ", bias.sizes());
    b = bias.contiguous();
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  auto f32 = logits.options();
  ScoreAndSelectOutput out;
  out.probs = at::empty({T, E}, f32);
  out.topk_idx = at::empty({T, top_k}, f32.dtype(at::kLong));
  out.topk_weight = at::empty({T, top_k}, f32);
  out.lse = at::empty({T}, f32);
  at::Tensor counts = at::zeros({E}, f32.dtype(at::kInt));
  if (poison) {
    out.probs.fill_(NAN);
    out.topk_idx.fill_(-1);
    out.topk_weight.fill_(NAN);
    out.lse.fill_(NAN);
  }
  const bool normalize = normalize_topk && (top_k > 1 || sigmoid_scores);
  if (T > 0) {
    auto stream = at::cuda::getCurrentCUDAStream();
    const dim3 grid(static_cast<unsigned>(grid_for(T))), block(kWarp * kWarpsPerBlock);
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    auto launch = [&](auto kernel) {
      kernel<<<grid, block, 0, stream>>>(
          logits.data_ptr<float>(), bp, T, static_cast<int>(E), static_cast<int>(top_k), normalize,
          static_cast<int>(n_group), static_cast<int>(topk_group),
          static_cast<int>(group_score_experts), out.probs.data_ptr<float>(),
          out.topk_idx.data_ptr<int64_t>(), out.topk_weight.data_ptr<float>(),
          out.lse.data_ptr<float>(), counts.data_ptr<int>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (sigmoid_scores) {
      launch(router_forward_kernel<true>);
    } else {
      launch(router_forward_kernel<false>);
    }
  }
  out.tokens_per_expert = counts.to(at::kLong);
  return out;
}

at::Tensor score_and_select_backward(const at::Tensor& logits, const at::Tensor& probs,
                                     const at::Tensor& topk_idx, const at::Tensor& topk_weight,
                                     const at::Tensor& lse, const at::Tensor& grad_probs,
                                     const at::Tensor& grad_weight, const at::Tensor& grad_lse,
                                     bool sigmoid_scores, bool normalize_topk) {
  // logits: needed (and checked) for sigmoid scores only; softmax takes everything from probs.
  check_logits(probs);
  if (sigmoid_scores) check_logits(logits);
  const int64_t T = probs.size(0), E = probs.size(1), k = topk_idx.size(1);
  TORCH_CHECK((!sigmoid_scores || logits.sizes() == probs.sizes()) &&
                  topk_weight.sizes() == topk_idx.sizes() && topk_idx.size(0) == T &&
                  lse.numel() == T,
              "moe router kernel: backward shapes disagree: probs ", probs.sizes(), ", topk ",
              topk_idx.sizes(), " / ", topk_weight.sizes(), ", lse ", lse.sizes());
  auto contiguous_f32 = [](const at::Tensor& g) {
    return g.defined() ? g.to(at::kFloat).contiguous() : g;
  };
  const at::Tensor gp = contiguous_f32(grad_probs), gw = contiguous_f32(grad_weight),
                   gl = contiguous_f32(grad_lse);
  const at::Tensor lc = sigmoid_scores ? logits.contiguous() : at::Tensor(),
                   pc = probs.contiguous(), ic = topk_idx.contiguous(),
                   wc = topk_weight.contiguous(), sc = lse.contiguous();
  const c10::cuda::CUDAGuard guard(probs.device());
  at::Tensor grad_logits = at::empty({T, E}, probs.options());
  const bool normalize = normalize_topk && (k > 1 || sigmoid_scores);
  if (argument_checks()) check_values_in_range(topk_idx, 0, E, "topk_idx (expert ids)");
  if (T > 0) {
    auto stream = at::cuda::getCurrentCUDAStream();
    const dim3 grid(static_cast<unsigned>(grid_for(T))), block(kWarp * kWarpsPerBlock);
    auto ptr = [](const at::Tensor& x) { return x.defined() ? x.data_ptr<float>() : nullptr; };
    auto launch = [&](auto kernel) {
      kernel<<<grid, block, 0, stream>>>(
          ptr(lc), pc.data_ptr<float>(), ic.data_ptr<int64_t>(), wc.data_ptr<float>(),
          sc.data_ptr<float>(), ptr(gp), ptr(gw), ptr(gl), T, static_cast<int>(E),
          static_cast<int>(k), normalize, grad_logits.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (sigmoid_scores) {
      launch(router_backward_kernel<true>);
    } else {
      launch(router_backward_kernel<false>);
    }
  }
  return grad_logits;
}

}  // namespace detail
}  // namespace moe::kernels
