// The per-token bodies of the permute family's row kernels (src/kernels/permute.cu), shared with
// their CPU emulation (tests/kernels/permute_emulation.cpp): the emulation runs this very code for
// every (token, lane) on the host, so CI exercises the kernels' indexing, vector tails, dropped
// assignments and summation order; only the launch and the cross-lane shuffle differ.
//
// Layout (token_layout): `lanes` threads (a power of two <= 32) own one token; a 256-thread block
// holds 256 / lanes tokens. A row of d elements is read as row_vecs packs of `vec` elements
// (16 bytes when rows and base pointers allow, else one element); lane l takes packs l, l + lanes,
// ... K (1..8) is a template parameter: the K row indices and weights are loaded once into
// registers and, per pack, all K loads issue before the arithmetic. K = 0 is the fallback for
// k > 8 (chunks of 8). Sums run in fp32 over j = 0..k-1 in order (fmaf where weighted): the same
// order and rounding points as the ATen reference's fp32 accumulation, and deterministic (no
// atomics; every output element has one writer).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

// Unrolled by nvcc; plain loops for the host compiler (which would warn on the pragma).
#ifdef __CUDACC__
#define MOE_UNROLL _Pragma("unroll")
#else
#define MOE_UNROLL
#endif

namespace moe::kernels::token_rows {

constexpr int kThreads = 256;  // threads per block
constexpr int kMaxLanes = 32;  // lanes per token: one warp at most (the dot reduces by shuffles)
constexpr int kMaxUnrolledK = 8;

struct TokenLayout {
  int vec = 1;           // elements per pack
  int64_t row_vecs = 0;  // packs per row (d / vec)
  int lanes = 1;         // threads per token
  int tokens_per_block = kThreads;
};

// vec16_ok: every row of every tensor the kernel touches starts on a 16-byte boundary.
inline TokenLayout token_layout(int64_t d, int64_t elem_size, bool vec16_ok) {
  TokenLayout l;
  const bool packs = vec16_ok && (d * elem_size) % 16 == 0 && elem_size <= 16;
  l.vec = packs ? static_cast<int>(16 / elem_size) : 1;
  l.row_vecs = d / l.vec;
  while (l.lanes < kMaxLanes && l.lanes < l.row_vecs) l.lanes *= 2;
  l.tokens_per_block = kThreads / l.lanes;
  return l;
}

// Levels of the cross-lane tree that reduces a token's dot products (log2 lanes).
inline int reduce_levels(int lanes) {
  int levels = 0;
  while ((1 << levels) < lanes) ++levels;
  return levels;
}

template <int N>
using Int = std::integral_constant<int, N>;

// Calls launch(Int<K>, Int<V>) with the row kernels' template arguments: K = k for the common
// top-k values (1, 2, 4, 6, 8), else 0 (runtime k, chunks of 8); V = elements per 16-byte pack,
// or 1 when the rows do not allow packs (then K = 0 too: the rare path stays one instantiation).
template <typename T, typename Launch>
void with_row_shape(int64_t k, int vec, Launch&& launch) {
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  if (vec != kPack) return launch(Int<0>{}, Int<1>{});
  switch (k) {
    case 1:
      return launch(Int<1>{}, Int<kPack>{});
    case 2:
      return launch(Int<2>{}, Int<kPack>{});
    case 4:
      return launch(Int<4>{}, Int<kPack>{});
    case 6:
      return launch(Int<6>{}, Int<kPack>{});
    case 8:
      return launch(Int<8>{}, Int<kPack>{});
    default:
      return launch(Int<0>{}, Int<kPack>{});
  }
}

// Calls body(T{}) for fp32, fp16 and bf16: the dtypes training runs in (fp64 would only add
// instantiations).
template <typename Body>
void with_row_dtype(c10::ScalarType dtype, const char* what, Body&& body) {
  switch (dtype) {
    case c10::kFloat:
      return body(float{});
    case c10::kHalf:
      return body(c10::Half{});
    case c10::kBFloat16:
      return body(c10::BFloat16{});
    default:
      TORCH_CHECK(false, "moe kernels: ", what, " supports fp32, fp16 and bf16, got ", dtype);
  }
}

// Every row of d elements starts on a 16-byte boundary in each of the given buffers.
inline bool rows_aligned16(int64_t d, int64_t elem_size, std::initializer_list<const void*> bases) {
  if ((d * elem_size) % 16 != 0) return false;
  for (const void* p : bases) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
C10_HOST_DEVICE inline Pack<T, V> load_pack(const T* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const Pack<T, V>*>(p);
#else
  Pack<T, V> out;
  std::memcpy(&out, p, sizeof(out));
  return out;
#endif
}

template <typename T, int V>
C10_HOST_DEVICE inline void store_pack(T* p, const Pack<T, V>& value) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<Pack<T, V>*>(p) = value;
#else
  std::memcpy(p, &value, sizeof(value));
#endif
}

// The K (or, for K = 0, up to 8) assignments of one chunk of token t: rows (-1 = dropped, or an
// index outside [0, n): treated as dropped) and weights, loaded once.
template <int K>
struct Chunk {
  static constexpr int kSlots = K > 0 ? K : kMaxUnrolledK;
  int64_t row[kSlots];
  float weight[kSlots];
  bool kept[kSlots];
};

template <int K>
C10_HOST_DEVICE inline Chunk<K> load_chunk(const int64_t* rows_t, const float* weights_t,
                                           int64_t j0, int64_t k, int64_t n) {
  Chunk<K> c;
  MOE_UNROLL
  for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {
    const int64_t j = j0 + jj;
    const bool in_chunk = K > 0 || j < k;
    const int64_t r = in_chunk ? rows_t[j] : -1;
    c.kept[jj] = r >= 0 && r < n;
    c.row[jj] = c.kept[jj] ? r : 0;
    c.weight[jj] = in_chunk && weights_t != nullptr ? weights_t[j] : 0.f;
  }
  return c;
}

template <int K>
C10_HOST_DEVICE inline int64_t chunk_step() {
  return Chunk<K>::kSlots;
}

// out_t[c] = sum_j (weights ? w_j : 1) * src[row_j][c] over kept j, fp32, one rounding.
// Combine forward (weighted) and permute backward (weights == nullptr).
template <int K, int V, typename T>
C10_HOST_DEVICE inline void sum_rows_lane(const T* src, int64_t n, const int64_t* rows_t,
                                          const float* weights_t, int64_t k, const TokenLayout& l,
                                          int lane, T* out_t) {
  const int64_t d = l.row_vecs * V;
  // K > 0: one chunk, indices and weights in registers for the whole row.
  Chunk<K> first = load_chunk<K>(rows_t, weights_t, 0, k, n);
  for (int64_t p = lane; p < l.row_vecs; p += l.lanes) {
    float acc[V];
    MOE_UNROLL
    for (int e = 0; e < V; ++e) acc[e] = 0.f;
    for (int64_t j0 = 0; j0 < (K > 0 ? K : k); j0 += chunk_step<K>()) {
      const Chunk<K> c = (K > 0 || j0 == 0) ? first : load_chunk<K>(rows_t, weights_t, j0, k, n);
      Pack<T, V> in[Chunk<K>::kSlots];
      MOE_UNROLL
      for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {  // every load issues first
        if (c.kept[jj]) in[jj] = load_pack<T, V>(src + c.row[jj] * d + p * V);
      }
      MOE_UNROLL
      for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {
        if (!c.kept[jj]) continue;
        MOE_UNROLL
        for (int e = 0; e < V; ++e) {
          const float v = static_cast<float>(in[jj].v[e]);
          acc[e] = weights_t != nullptr ? fmaf(c.weight[jj], v, acc[e]) : acc[e] + v;
        }
      }
    }
    Pack<T, V> o;
    MOE_UNROLL
    for (int e = 0; e < V; ++e) o.v[e] = static_cast<T>(acc[e]);
    store_pack<T, V>(out_t + p * V, o);
  }
}

// Permute forward: x[t] read once, written to each kept row of token t.
template <int K, int V, typename T>
C10_HOST_DEVICE inline void scatter_row_lane(const T* x_t, int64_t n, const int64_t* rows_t,
                                             int64_t k, const TokenLayout& l, int lane, T* out) {
  const int64_t d = l.row_vecs * V;
  for (int64_t j0 = 0; j0 < (K > 0 ? K : k); j0 += chunk_step<K>()) {
    const Chunk<K> c = load_chunk<K>(rows_t, nullptr, j0, k, n);
    for (int64_t p = lane; p < l.row_vecs; p += l.lanes) {
      const Pack<T, V> v = load_pack<T, V>(x_t + p * V);
      MOE_UNROLL
      for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {
        if (c.kept[jj]) store_pack<T, V>(out + c.row[jj] * d + p * V, v);
      }
    }
  }
}

// Combine backward for the assignments j0 .. j0 + slots - 1 of token t, one lane's share:
// grad_y[row_j] = w_j * grad_out[t] (one rounding) and dots[jj] = this lane's fmaf chain of
// grad_out[t][c] * y[row_j][c] over its packs in order (the caller reduces dots across lanes).
template <int K, int V, typename T>
C10_HOST_DEVICE inline void combine_backward_lane(const T* grad_out_t, const T* y,
                                                  const Chunk<K>& c, const TokenLayout& l, int lane,
                                                  T* grad_y, float (&dots)[Chunk<K>::kSlots]) {
  const int64_t d = l.row_vecs * V;
  MOE_UNROLL
  for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) dots[jj] = 0.f;
  for (int64_t p = lane; p < l.row_vecs; p += l.lanes) {
    const Pack<T, V> g = load_pack<T, V>(grad_out_t + p * V);
    Pack<T, V> yv[Chunk<K>::kSlots];
    MOE_UNROLL
    for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {  // every load issues first
      if (c.kept[jj]) yv[jj] = load_pack<T, V>(y + c.row[jj] * d + p * V);
    }
    MOE_UNROLL
    for (int jj = 0; jj < Chunk<K>::kSlots; ++jj) {
      if (!c.kept[jj]) continue;
      Pack<T, V> gy;
      MOE_UNROLL
      for (int e = 0; e < V; ++e) {
        const float gf = static_cast<float>(g.v[e]);
        gy.v[e] = static_cast<T>(c.weight[jj] * gf);
        dots[jj] = fmaf(gf, static_cast<float>(yv[jj].v[e]), dots[jj]);
      }
      store_pack<T, V>(grad_y + c.row[jj] * d + p * V, gy);
    }
  }
}

}  // namespace moe::kernels::token_rows
