// The 4-bit dequantization kernel's per-thread body (src/kernels/dequant_4bit.cu), shared with
// its CPU emulation (tests/kernels/dequant_4bit_emulation.cpp), which runs this very code for
// every thread index.
//
// What it computes is quant::dequantize_4bit's (moe/quant/bnb_4bit.h), rounding point for
// rounding point: value e = T(code[nibble e] * absmax[e / blocksize]), one fp32 product, where
// absmax is the stored fp32 one, or under double quant (dyn[absmax_q] * nested[b / 256]) + offset
// as two rounded fp32 operations. nvcc would contract that product and sum into one fma (one
// rounding), so the device code spells them with round-to-nearest intrinsics (rounding.h). The
// cast to T rounds to nearest even, as ATen's.
//
// Layout: codes hold two values a byte, the first in the high nibble. One thread owns V values
// (V / 2 bytes): V = 16 / sizeof(T) when the output is 16-byte aligned, n and the blocksize are
// multiples of V, so one 16-byte store and one absmax per thread; else V = 2 (one byte, two values,
// the second skipped past n when n is odd). blocksize is even, so a thread never straddles blocks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "moe/kernels/permute_token.h"  // Pack, load_pack, store_pack, MOE_UNROLL
#include "moe/kernels/rounding.h"

namespace moe::kernels::dequant_4bit_rows {

constexpr int kCodes = 16;             // a 4-bit code book
constexpr int kDynamic = 256;          // the 8-bit map of the double-quantized absmax
constexpr int64_t kNestedBlock = 256;  // absmax values per nested absmax (quant::kNestedBlocksize)

struct Dequant4bitShape {
  int64_t n = 0;           // values
  int64_t blocksize = 64;  // values per absmax
  int vec = 2;             // values per thread
  bool double_quant = false;
};

inline int64_t thread_count(const Dequant4bitShape& s) { return (s.n + s.vec - 1) / s.vec; }

// The state's buffers on the kernel's device.
struct Dequant4bitArgs {
  const uint8_t* codes = nullptr;        // [ceil(n / 2)]
  const float* absmax = nullptr;         // [blocks], fp32 (no double quant)
  const uint8_t* absmax_q = nullptr;     // [blocks], double quant: indices into the dynamic map
  const float* nested_absmax = nullptr;  // [ceil(blocks / 256)]
  const float* offset = nullptr;         // one value (read where it lives: no host sync)
};

// Block b's fp32 absmax. `dyn`: the dynamic map (shared memory on the device).
struct BlockAbsmax {
  Dequant4bitArgs a;
  const float* dyn;
  C10_HOST_DEVICE float operator()(const Dequant4bitShape& s, int64_t b) const {
    if (!s.double_quant) return a.absmax[b];
    // Two roundings, as the reference's product and sum: no fma.
    const float scaled = rounding::mul_rn(dyn[a.absmax_q[b]], a.nested_absmax[b / kNestedBlock]);
    return rounding::add_rn(scaled, *a.offset);
  }
};

// fp32 -> T, round to nearest even (ATen's cast on either device).
template <typename T>
C10_HOST_DEVICE inline T to_out(float v) {
  return v;
}
template <>
C10_HOST_DEVICE inline c10::BFloat16 to_out<c10::BFloat16>(float v) {
#ifdef __CUDA_ARCH__
  return c10::BFloat16(__bfloat16_as_ushort(__float2bfloat16_rn(v)), c10::BFloat16::from_bits());
#else
  return c10::BFloat16(v);  // c10's round_to_nearest_even
#endif
}
template <>
C10_HOST_DEVICE inline c10::Half to_out<c10::Half>(float v) {
#ifdef __CUDA_ARCH__
  return c10::Half(__half_as_ushort(__float2half_rn(v)), c10::Half::from_bits());
#else
  return c10::Half(v);      // fp16_ieee_from_fp32_value: round to nearest even
#endif
}

// Thread i: values [i V, i V + V) of `out`. `code`: the 16-value code book; `absmax_of`:
// BlockAbsmax (the mutation tests pass faulty ones).
template <int V, typename T, typename Absmax>
C10_HOST_DEVICE inline void dequant_4bit_thread(const Dequant4bitShape& s, const uint8_t* codes,
                                                const float* code, const Absmax& absmax_of, T* out,
                                                int64_t i) {
  static_assert(V % 2 == 0, "whole bytes per thread");
  const int64_t e0 = i * V;
  const float am = absmax_of(s, e0 / s.blocksize);
  const auto bytes = token_rows::load_pack<uint8_t, V / 2>(codes + e0 / 2);
  if constexpr (V == 2) {  // one value or two; element stores
    out[e0] = to_out<T>(rounding::mul_rn(code[bytes.v[0] >> 4], am));
    if (e0 + 1 < s.n) out[e0 + 1] = to_out<T>(rounding::mul_rn(code[bytes.v[0] & 15], am));
  } else {
    token_rows::Pack<T, V> o;
    MOE_UNROLL
    for (int k = 0; k < V / 2; ++k) {
      o.v[2 * k] = to_out<T>(rounding::mul_rn(code[bytes.v[k] >> 4], am));
      o.v[2 * k + 1] = to_out<T>(rounding::mul_rn(code[bytes.v[k] & 15], am));
    }
    token_rows::store_pack<T, V>(out + e0, o);
  }
}

// The code book and the dynamic map, passed to the kernel by value (1 KiB of parameters) and
// copied into shared memory there.
struct Dequant4bitTables {
  float code[kCodes];
  float dyn[kDynamic];
};

}  // namespace moe::kernels::dequant_4bit_rows

namespace moe::kernels::detail {
// The launch over the state's buffers into `out` (CUDA, of the shape's dtype); C++17, as nvcc
// compiles it, so no quant/ or config/ header (C++20) here. detail::dequantize_4bit_cuda
// (dequant_4bit_ops.cpp) checks the arguments and calls it.
void dequantize_4bit_launch(const dequant_4bit_rows::Dequant4bitShape& s,
                            const dequant_4bit_rows::Dequant4bitArgs& a,
                            const dequant_4bit_rows::Dequant4bitTables& tables,
                            const at::Tensor& out);
}  // namespace moe::kernels::detail
