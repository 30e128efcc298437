// The SwiGLU family's per-thread body (src/kernels/swiglu.cu), shared with its CPU emulation
// (tests/kernels/swiglu_emulation.cpp), which runs this very code for every thread index. The
// family has two gates: silu (SwiGLU) and gelu with the tanh approximation (GeGLU, Gemma 4).
//
// h = silu(gate) * up as ATen computes it in two ops, each rounding to T (fp32/fp16/bf16):
//   forward   s = T(gate / (1 + exp(-gate)))          h = T(s * up)
//   backward  ds = T(dh * up)  d_up = T(dh * s)       d_gate = T(ds * sig * (1 + gate (1 - sig)))
//             with sig = 1 / (1 + exp(-gate)): ATen's silu_backward, whose 1 + gate (1 - sig)
//             nvcc contracts into one fma.
// GeGLU, h = gelu_tanh(gate) * up as ATen computes torch::gelu(gate, "tanh") * up:
//   forward   s = T(0.5 x (1 + tanh(b (x + k x^3))))      h = T(s * up)
//   backward  ds = T(dh * up)  d_up = T(dh * s)
//             d_gate = T(ds * (0.5 (1 + t) + 0.5 x (1 - t^2) b (1 + 3 k x^2)))
//             with ATen's fp32 constants b = sqrt(2 / pi) and k = 0.044715 and its CUDA kernels'
//             order of operations (ActivationGeluKernel.cu); where nvcc contracts a product
//             into the following add there, fma_rn does it here.
// The fused op reads gate and up once and writes h (forward), or reads dh, gate and up once and
// writes both gradients (backward); silu(gate) is recomputed, never stored. On the device every
// step matches ATen's CUDA kernels' rounding, so the two agree bit for bit (the GPU test checks).
//
// Layout: h and dh are contiguous [rows, cols]; gate and up (and their gradients) are [rows, cols]
// with a row stride of `stride` elements: cols for separate contiguous operands (then the whole
// tensor is one flat row), 2 cols for the packed [rows, 2 cols] output of one gate-and-up GEMM
// (up starting `cols` elements after gate). One thread owns one pack of V elements of a row:
// n / V threads; a pack never straddles rows (cols is a multiple of V).
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

#include "moe/kernels/permute_token.h"  // Pack, load_pack, store_pack, MOE_UNROLL
#include "moe/kernels/rounding.h"

namespace moe::kernels::swiglu_rows {

struct SwigluShape {
  int64_t n = 0;       // elements of h (= of gate, up and each gradient)
  int vec = 1;         // elements per pack
  int64_t cols = 0;    // elements per row of h
  int64_t stride = 0;  // row stride of gate and up (and of d_gate and d_up): cols or 2 cols
};

inline int64_t thread_count(const SwigluShape& s) { return s.n / s.vec; }

// Offset into gate/up of h's element e: h is contiguous, gate and up may have a longer row.
C10_HOST_DEVICE inline int64_t operand_offset(const SwigluShape& s, int64_t e) {
  if (s.stride == s.cols) return e;  // separate operands: no division
  const int64_t row = e / s.cols;
  return row * s.stride + (e - row * s.cols);
}

// 1 + e^-x as ATen's CUDA silu kernels compute it: the very expression, which nvcc compiles
// alike there and here. It does not round twice: nvcc inlines expf and contracts its final
// scaling with the + 1 into one fma (their sm_90 SASS: MUFU.EX2, then FFMA r, scale, ex2, 1).
// On the host (the emulation, -ffp-contract=off): the C library's exp, then the sum.
C10_HOST_DEVICE inline float one_plus_exp_neg(float x) {
#ifdef __CUDA_ARCH__
  return 1.f + expf(-x);
#else
  return 1.f + std::exp(-x);
#endif
}

// silu(x) in fp32, as ATen's CUDA silu kernel: x / (1 + exp(-x)), an IEEE division.
C10_HOST_DEVICE inline float silu_f(float x) { return rounding::div_rn(x, one_plus_exp_neg(x)); }

// dy times d silu / dx, as ATen's CUDA silu_backward kernel: dy * sig * (1 + x (1 - sig)), whose
// 1 + x (1 - sig) nvcc contracts into one fma there (FADD 1 - sig, FFMA x, ., 1, FMUL, FMUL).
C10_HOST_DEVICE inline float silu_grad_f(float dy, float x) {
  using namespace rounding;
  const float sig = div_rn(1.f, one_plus_exp_neg(x));
  return mul_rn(mul_rn(dy, sig), fma_rn(x, sub_rn(1.f, sig), 1.f));
}

// The gate function of the fused product.
enum class Gate { kSilu, kGeluTanh };

// ATen's constants for gelu's tanh form, as its kernels hold them in fp32: M_SQRT2 * M_2_SQRTPI *
// 0.5 (= sqrt(2 / pi)) in double, then rounded.
constexpr float kGeluBeta =
    static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
constexpr float kGeluKappa = 0.044715f;

// b (x + k x^3) as ATen's kernels compute it: x * x * x, then one fma.
C10_HOST_DEVICE inline float gelu_inner(float x) {
  using namespace rounding;
  const float cube = mul_rn(mul_rn(x, x), x);
  return mul_rn(kGeluBeta, fma_rn(kGeluKappa, cube, x));
}

C10_HOST_DEVICE inline float tanh_f(float x) {
#ifdef __CUDA_ARCH__
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}

// gelu(x), tanh form, in fp32 as ATen's CUDA gelu kernel: 0.5 x (1 + tanh(inner)).
C10_HOST_DEVICE inline float gelu_tanh_f(float x) {
  using namespace rounding;
  return mul_rn(mul_rn(0.5f, x), add_rn(1.f, tanh_f(gelu_inner(x))));
}

// dy times d gelu / dx, tanh form, as ATen's CUDA gelu_backward kernel. Its last sum rounds once
// here; where nvcc contracts the exact 0.5 * (1 + t) into it there, so does ATen's (contracting
// the other product would not: the GPU test reports any difference from ATen).
C10_HOST_DEVICE inline float gelu_tanh_grad_f(float dy, float x) {
  using namespace rounding;
  const float x_sq = mul_rn(x, x);
  const float t = tanh_f(mul_rn(kGeluBeta, fma_rn(kGeluKappa, mul_rn(x_sq, x), x)));
  const float left_derivative = mul_rn(0.5f, add_rn(1.f, t));
  const float tanh_derivative = fma_rn(-t, t, 1.f);
  const float inner_derivative = mul_rn(kGeluBeta, fma_rn(3.f * kGeluKappa, x_sq, 1.f));
  const float right = mul_rn(mul_rn(mul_rn(0.5f, x), tanh_derivative), inner_derivative);
  return mul_rn(dy, add_rn(left_derivative, right));
}

template <Gate G>
C10_HOST_DEVICE inline float gate_f(float x) {
  if constexpr (G == Gate::kSilu) {
    return silu_f(x);
  } else {
    return gelu_tanh_f(x);
  }
}

template <Gate G>
C10_HOST_DEVICE inline float gate_grad_f(float dy, float x) {
  if constexpr (G == Gate::kSilu) {
    return silu_grad_f(dy, x);
  } else {
    return gelu_tanh_grad_f(dy, x);
  }
}

template <int V, typename T, Gate G = Gate::kSilu>
C10_HOST_DEVICE inline void swiglu_forward_thread(const SwigluShape& s, const T* gate, const T* up,
                                                  T* h, int64_t i) {
  using namespace rounding;
  const int64_t at = operand_offset(s, i * V);
  const auto g = token_rows::load_pack<T, V>(gate + at), u = token_rows::load_pack<T, V>(up + at);
  token_rows::Pack<T, V> o;
  MOE_UNROLL
  for (int e = 0; e < V; ++e) {
    const float s = in_t<T>(gate_f<G>(static_cast<float>(g.v[e])));
    o.v[e] = static_cast<T>(mul_rn(s, static_cast<float>(u.v[e])));
  }
  token_rows::store_pack<T, V>(h + i * V, o);
}

template <int V, typename T, Gate G = Gate::kSilu>
C10_HOST_DEVICE inline void swiglu_backward_thread(const SwigluShape& s, const T* dh, const T* gate,
                                                   const T* up, T* d_gate, T* d_up, int64_t i) {
  using namespace rounding;
  const int64_t at = operand_offset(s, i * V);
  const auto d = token_rows::load_pack<T, V>(dh + i * V);
  const auto g = token_rows::load_pack<T, V>(gate + at), u = token_rows::load_pack<T, V>(up + at);
  token_rows::Pack<T, V> dg, du;
  MOE_UNROLL
  for (int e = 0; e < V; ++e) {
    const float x = static_cast<float>(g.v[e]), dy = static_cast<float>(d.v[e]);
    const float s = in_t<T>(gate_f<G>(x));  // the gate's output autograd would have saved
    du.v[e] = static_cast<T>(mul_rn(dy, s));
    const float ds = in_t<T>(mul_rn(dy, static_cast<float>(u.v[e])));
    dg.v[e] = static_cast<T>(gate_grad_f<G>(ds, x));
  }
  token_rows::store_pack<T, V>(d_gate + at, dg);
  token_rows::store_pack<T, V>(d_up + at, du);
}

}  // namespace moe::kernels::swiglu_rows
