// The MXFP4 dequantization kernel's per-thread body (src/kernels/dequant_mxfp4.cu), shared with
// its CPU emulation (tests/kernels/dequant_mxfp4_emulation.cpp), which runs this very code for
// every thread index.
//
// What it computes is quant::dequantize_mxfp4's (moe/quant/mxfp4.h): value e = T(ldexp(e2m1[code],
// scale - 127)), the code the low nibble of byte e / 2 for even e and the high nibble for odd e,
// the scale byte the one of block e / 32. ATen's ldexp with an integer exponent is std::ldexp in
// double on the CPU and ::ldexp in fp32 on CUDA, then one cast to T: the exact product rounded
// once. Zero stays zero (no 0 x 2^128 = NaN) and 0.5 x 2^128 is 2^127, not inf.
//
// The body reproduces that without ldexp: twice the e2m1 value is a small integer
// {0, 1, 2, 3, 4, 6, 8, 12} and 2^(scale - 128) is an fp32 built from bits for every byte (2^-128
// and 2^-127 are subnormals, 2^127 is the largest power), so one fp32 product is that exact
// product (at most 4 significant bits times a power of two, never below 2^-128), or rounds to inf
// where it is 2^128 or more, as the reference's double -> fp32 cast does. The cast to T rounds to
// nearest even, as ATen's (fp16 subnormals, overflow to inf).
//
// Layout: one thread owns V values (V / 2 bytes of one block): V = 16 / sizeof(T) when the output
// is 16-byte aligned and the blocks V / 2-byte aligned, so one 16-byte store per thread; else
// V = 2 (one byte, element stores). n is a multiple of 32, so every thread is whole.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include <cstdint>
#include <cstring>

#include "moe/kernels/dequant_4bit_pack.h"  // to_out: fp32 -> T, round to nearest even
#include "moe/kernels/permute_token.h"      // Pack, load_pack, store_pack, MOE_UNROLL
#include "moe/kernels/rounding.h"

namespace moe::kernels::dequant_mxfp4_rows {

constexpr int64_t kBlockBytes = 16;   // quant::kMxfp4BlockBytes
constexpr int64_t kBlockValues = 32;  // values per scale byte

struct DequantMxfp4Shape {
  int64_t n = 0;  // values: 2 x the block bytes, a multiple of 32
  int vec = 2;    // values per thread
};

inline int64_t thread_count(const DequantMxfp4Shape& s) { return (s.n + s.vec - 1) / s.vec; }

// The buffers on the kernel's device.
struct DequantMxfp4Args {
  const uint8_t* blocks = nullptr;  // [n / 2]: two e2m1 codes a byte, the first in the low nibble
  const uint8_t* scales = nullptr;  // [n / 32]: e8m0, 2^(scale - 127)
};

C10_HOST_DEVICE inline float float_from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// Twice the e2m1 value of a 4-bit code (sign, two exponent bits, one mantissa bit): the
// magnitudes {0, 1, 2, 3, 4, 6, 8, 12} are nibbles of one constant; code 8 is -0.
C10_HOST_DEVICE inline float twice_e2m1(uint32_t code) {
  const float m = static_cast<float>((0xC8643210u >> (4 * (code & 7))) & 15);
  return (code & 8) ? -m : m;
}

// 2^(scale - 128) from its fp32 bits: a normal number for scale >= 2, the subnormals 2^-127
// (0x00400000) and 2^-128 (0x00200000) for 1 and 0. Exact for all 256 bytes (no exp2f).
C10_HOST_DEVICE inline float half_scale(uint32_t scale) {
  return float_from_bits(scale >= 2 ? (scale - 1) << 23 : 0x00200000u << scale);
}

// Block b's factor: half_scale of its scale byte (the mutation tests pass faulty ones).
struct BlockScale {
  const uint8_t* scales;
  C10_HOST_DEVICE float operator()(int64_t b) const { return half_scale(scales[b]); }
};

// One value: the exact product, rounded to T.
template <typename T>
C10_HOST_DEVICE inline T dequant_value(uint32_t code, float half_scale_b) {
  return dequant_4bit_rows::to_out<T>(rounding::mul_rn(twice_e2m1(code), half_scale_b));
}

// Thread i: values [i V, i V + V) of `out`, bytes [i V / 2, i V / 2 + V / 2) of `blocks`.
template <int V, typename T, typename Scale>
C10_HOST_DEVICE inline void dequant_mxfp4_thread(const DequantMxfp4Shape& s, const uint8_t* blocks,
                                                 const Scale& scale_of, T* out, int64_t i) {
  static_assert(V % 2 == 0 && kBlockValues % V == 0, "whole bytes of one block per thread");
  (void)s;
  const int64_t e0 = i * V;
  const float scale = scale_of(e0 / kBlockValues);
  const auto bytes = token_rows::load_pack<uint8_t, V / 2>(blocks + e0 / 2);
  if constexpr (V == 2) {  // element stores
    out[e0] = dequant_value<T>(bytes.v[0] & 15u, scale);
    out[e0 + 1] = dequant_value<T>(bytes.v[0] >> 4, scale);
  } else {
    token_rows::Pack<T, V> o;
    MOE_UNROLL
    for (int k = 0; k < V / 2; ++k) {
      o.v[2 * k] = dequant_value<T>(bytes.v[k] & 15u, scale);
      o.v[2 * k + 1] = dequant_value<T>(bytes.v[k] >> 4, scale);
    }
    token_rows::store_pack<T, V>(out + e0, o);
  }
}

}  // namespace moe::kernels::dequant_mxfp4_rows

namespace moe::kernels::detail {
// The launch over the buffers into `out` (CUDA, of the shape's dtype); C++17, as nvcc compiles
// it, so no quant/ header (C++20) here. detail::dequantize_mxfp4_cuda (dequant_mxfp4_ops.cpp)
// checks the arguments and calls it.
void dequantize_mxfp4_launch(const dequant_mxfp4_rows::DequantMxfp4Shape& s,
                             const dequant_mxfp4_rows::DequantMxfp4Args& a, const at::Tensor& out);
}  // namespace moe::kernels::detail
