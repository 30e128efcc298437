// The rotary family's per-thread body (src/kernels/rotary.cu), shared with its CPU emulation
// (tests/kernels/rotary_emulation.cpp), which runs this very code for every thread index.
//
// Rotary positions as Hugging Face's rotate_half computes them, x [B, N, S, hd] with halves
// x1 = x[..., :h], x2 = x[..., h:] (h = hd / 2):
//   forward   out1 = x1 c1 + (-x2) s1            out2 = x2 c2 + x1 s2
//   backward  g'1  = g1 c1 + g2 s2               g'2  = g2 c2 + (-(g1 s1))
// with every product and sum rounded to T where ATen's elementwise ops round it (x * cos,
// rotated * sin, their sum; autograd's two gradient paths, then their sum), so the fused op
// equals the ATen reference bit for bit in fp32, fp16 and bf16. Products and sums are taken
// with round-to-nearest intrinsics on the device: nvcc would otherwise contract a*b + c into an
// fma, which rounds once where ATen rounds twice.
//
// One thread owns one pack of V elements of the first half of a row and the matching pack of
// the second half (both read once, both outputs written once): B * N * S * (h / V) threads.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "moe/kernels/permute_token.h"  // Pack, load_pack, store_pack, MOE_UNROLL
#include "moe/kernels/rounding.h"       // mul_rn, add_rn, in_t

namespace moe::kernels::rotary_rows {

using rounding::add_rn;
using rounding::in_t;
using rounding::mul_rn;

struct RotaryShape {
  int64_t B = 0, N = 0, S = 0, hd = 0;  // x viewed as [B, N, S, hd]
  int64_t x_stride[3] = {0, 0, 0};      // elements between b, n, s neighbours; hd is contiguous
  int64_t out_stride[3] = {0, 0, 0};
  int64_t table_batch_stride = 0;  // cos/sin: 0 = one [S, hd] table, S * hd = [B, 1, S, hd]
  int vec = 1;                     // elements per pack
};

inline int64_t thread_count(const RotaryShape& s) { return s.B * s.N * s.S * (s.hd / 2 / s.vec); }

template <int V, typename T>
C10_HOST_DEVICE inline void rotary_thread(const T* x, const T* cos, const T* sin, T* out,
                                          const RotaryShape& s, int64_t i, bool backward) {
  const int64_t h = s.hd / 2, packs = h / V;
  const int64_t p = i % packs;
  int64_t row = i / packs;
  const int64_t si = row % s.S;
  row /= s.S;
  const int64_t n = row % s.N, b = row / s.N;
  const int64_t c1 = p * V, c2 = h + p * V;  // the two packs' first columns
  const T* xr = x + b * s.x_stride[0] + n * s.x_stride[1] + si * s.x_stride[2];
  T* outr = out + b * s.out_stride[0] + n * s.out_stride[1] + si * s.out_stride[2];
  const int64_t tr = b * s.table_batch_stride + si * s.hd;
  const auto x1 = token_rows::load_pack<T, V>(xr + c1), x2 = token_rows::load_pack<T, V>(xr + c2);
  const auto cos1 = token_rows::load_pack<T, V>(cos + tr + c1),
             cos2 = token_rows::load_pack<T, V>(cos + tr + c2);
  const auto sin1 = token_rows::load_pack<T, V>(sin + tr + c1),
             sin2 = token_rows::load_pack<T, V>(sin + tr + c2);
  token_rows::Pack<T, V> o1, o2;
  MOE_UNROLL
  for (int e = 0; e < V; ++e) {
    const float a = static_cast<float>(x1.v[e]), z = static_cast<float>(x2.v[e]);
    const float direct1 = in_t<T>(mul_rn(a, static_cast<float>(cos1.v[e])));
    const float direct2 = in_t<T>(mul_rn(z, static_cast<float>(cos2.v[e])));
    float cross1, cross2;
    if (!backward) {  // rotated = (-x2, x1), times sin
      cross1 = in_t<T>(mul_rn(-z, static_cast<float>(sin1.v[e])));
      cross2 = in_t<T>(mul_rn(a, static_cast<float>(sin2.v[e])));
    } else {  // the gradient through rotated: (g2 s2, -(g1 s1))
      cross1 = in_t<T>(mul_rn(z, static_cast<float>(sin2.v[e])));
      cross2 = -in_t<T>(mul_rn(a, static_cast<float>(sin1.v[e])));
    }
    o1.v[e] = static_cast<T>(add_rn(direct1, cross1));
    o2.v[e] = static_cast<T>(add_rn(direct2, cross2));
  }
  token_rows::store_pack<T, V>(outr + c1, o1);
  token_rows::store_pack<T, V>(outr + c2, o2);
}

}  // namespace moe::kernels::rotary_rows
