// gpt-oss's clamped SwiGLU kernel's per-thread body (src/kernels/clamped_swiglu.cu), shared with
// its CPU emulation (tests/kernels/clamped_swiglu_emulation.cpp), which runs this very code for
// every thread index.
//
// The ATen reference (clamped_swiglu_reference) is seven ops forward, each rounding to T
// (fp32/fp16/bf16; opmath fp32 inside each op), with L = T(limit) and alpha in fp32:
//   g = min(gate, L)   u = clamp(up, -L, L)          (exact: a T value or the bound L)
//   a = T(g * alpha)   sig = T(1 / (1 + exp(-a)))    glu = T(g * sig)
//   p = T(u + 1)       h = T(p * glu)
// and its autograd backward ten more:
//   d_p = T(dh * glu)          d_up = d_p where -L <= up <= L, else 0
//   d_glu = T(dh * p)          d_g1 = T(d_glu * sig)     d_sig = T(d_glu * g)
//   d_a = T(T(d_sig * T(1 - sig)) * sig)   (ATen's CUDA sigmoid_backward computes in T itself:
//                                           c10::BFloat16/Half arithmetic rounds each step)
//   d_g2 = T(d_a * alpha)      d_gate = T(d_g1 + d_g2) where gate <= L, else 0
// (the two gradients of g summed by autograd; torch's clamp backward passes the gradient where
// the input lies inside the bounds, bounds included). The scalars enter as ATen's CUDA kernels
// take them: alpha as fp32 (the wrapped double read as opmath), the clamp's bound as T(limit)
// (clamp compares against fp32 limit and stores T(limit); the backward's comparisons read the
// scalar as T: the same boundary element for every T value).
//
// The fused op reads gate and up once and writes h (forward), or reads dh, gate and up once and
// writes both gradients (backward); sig, glu and p are recomputed, never stored. Every step above
// is one round-to-nearest operation (moe/kernels/rounding.h) at the same place, so on the device
// the fused op matches ATen's CUDA kernels bit for bit, up to how nvcc built `1.f + expf(-a)` in
// each (the same caveat as swiglu_pack.h's one_plus_exp_neg; the GPU test reports it). In fp32
// each T(...) is the identity and the chain is ATen's fp32 chain.
//
// Layout: gate, up, h, dh and both gradients are contiguous and of one shape (n elements). One
// thread owns one pack of V elements: n / V threads.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "moe/kernels/permute_token.h"  // Pack, load_pack, store_pack, MOE_UNROLL
#include "moe/kernels/rounding.h"
#include "moe/kernels/swiglu_pack.h"  // one_plus_exp_neg

namespace moe::kernels::clamped_swiglu_rows {

struct ClampedSwigluShape {
  int64_t n = 0;  // elements of h (= of gate, up, dh and each gradient)
  int vec = 1;    // elements per pack
};

inline int64_t thread_count(const ClampedSwigluShape& s) { return s.n / s.vec; }

// The op's scalars as the kernels take them: the clamp's bound T(limit) (exactly ATen's bound for
// every T) and the sigmoid's slope in fp32.
struct ClampedSwigluParams {
  float bound = 0;
  float alpha = 0;
};

template <typename T>
ClampedSwigluParams clamped_swiglu_params(double limit, double alpha) {
  return {static_cast<float>(static_cast<T>(static_cast<float>(limit))), static_cast<float>(alpha)};
}

// min(x, hi), NaN kept (ATen's clamp propagates NaN).
C10_HOST_DEVICE inline float clamp_max_f(float x, float hi) { return hi < x ? hi : x; }
// min(max(x, lo), hi), NaN kept: ATen's clamp(x, lo, hi) for lo <= hi, and hi where lo > hi.
C10_HOST_DEVICE inline float clamp_f(float x, float lo, float hi) {
  const float y = x < lo ? lo : x;
  return hi < y ? hi : y;
}
// Where torch's clamp backward lets the gradient through: inside the bounds, bounds included
// (NaN: not inside).
C10_HOST_DEVICE inline bool passes_max(float x, float hi) { return x <= hi; }
C10_HOST_DEVICE inline bool passes(float x, float lo, float hi) { return x >= lo && x <= hi; }

// sigmoid(alpha g) as ATen's mul (by an fp32 scalar) and sigmoid kernels round it: T each.
template <typename T>
C10_HOST_DEVICE inline float sigmoid_alpha(float g, float alpha) {
  using namespace rounding;
  const float a = in_t<T>(mul_rn(g, alpha));
  return in_t<T>(div_rn(1.f, swiglu_rows::one_plus_exp_neg(a)));
}

template <int V, typename T>
C10_HOST_DEVICE inline void clamped_swiglu_forward_thread(const ClampedSwigluParams& p,
                                                          const T* gate, const T* up, T* h,
                                                          int64_t i) {
  using namespace rounding;
  const auto gp = token_rows::load_pack<T, V>(gate + i * V);
  const auto up_p = token_rows::load_pack<T, V>(up + i * V);
  token_rows::Pack<T, V> o;
  MOE_UNROLL
  for (int e = 0; e < V; ++e) {
    const float g = clamp_max_f(static_cast<float>(gp.v[e]), p.bound);
    const float u = clamp_f(static_cast<float>(up_p.v[e]), -p.bound, p.bound);
    const float glu = in_t<T>(mul_rn(g, sigmoid_alpha<T>(g, p.alpha)));
    const float up1 = in_t<T>(add_rn(u, 1.f));
    o.v[e] = static_cast<T>(mul_rn(up1, glu));
  }
  token_rows::store_pack<T, V>(h + i * V, o);
}

template <int V, typename T>
C10_HOST_DEVICE inline void clamped_swiglu_backward_thread(const ClampedSwigluParams& p,
                                                           const T* dh, const T* gate, const T* up,
                                                           T* d_gate, T* d_up, int64_t i) {
  using namespace rounding;
  const auto d = token_rows::load_pack<T, V>(dh + i * V);
  const auto gp = token_rows::load_pack<T, V>(gate + i * V);
  const auto up_p = token_rows::load_pack<T, V>(up + i * V);
  token_rows::Pack<T, V> dg, du;
  MOE_UNROLL
  for (int e = 0; e < V; ++e) {
    const float x = static_cast<float>(gp.v[e]), y = static_cast<float>(up_p.v[e]);
    const float dy = static_cast<float>(d.v[e]);
    const float g = clamp_max_f(x, p.bound);
    const float u = clamp_f(y, -p.bound, p.bound);
    // The forward's intermediates, as autograd would have saved them.
    const float sig = sigmoid_alpha<T>(g, p.alpha);
    const float glu = in_t<T>(mul_rn(g, sig));
    const float up1 = in_t<T>(add_rn(u, 1.f));
    // h = up1 * glu
    const float d_up1 = mul_rn(dy, glu);
    const float d_glu = in_t<T>(mul_rn(dy, up1));
    // glu = g * sig
    const float d_g1 = in_t<T>(mul_rn(d_glu, sig));
    const float d_sig = in_t<T>(mul_rn(d_glu, g));
    // sig = sigmoid(a): ATen's sigmoid_backward, d_sig * (1 - sig) * sig in T arithmetic
    const float d_a = in_t<T>(mul_rn(in_t<T>(mul_rn(d_sig, in_t<T>(sub_rn(1.f, sig)))), sig));
    // a = g * alpha
    const float d_g2 = in_t<T>(mul_rn(d_a, p.alpha));
    dg.v[e] = passes_max(x, p.bound) ? static_cast<T>(add_rn(d_g1, d_g2)) : static_cast<T>(0.f);
    du.v[e] = passes(y, -p.bound, p.bound) ? static_cast<T>(d_up1) : static_cast<T>(0.f);
  }
  token_rows::store_pack<T, V>(d_gate + i * V, dg);
  token_rows::store_pack<T, V>(d_up + i * V, du);
}

}  // namespace moe::kernels::clamped_swiglu_rows
