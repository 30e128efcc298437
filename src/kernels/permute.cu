// The permute family's kernels and raw launches (detail::dispatch_plan, permute_forward/backward,
// combine_forward/backward; autograd ops in permute_ops.cpp).
//
// Layout of this file: kernels, then checked launchers, then tensor-level wrappers. The row
// kernels (permute, combine and their backwards) work per token: their bodies live in
// moe/kernels/permute_token.h, which the CPU emulation runs too.
// Deterministic by construction: no atomics; every output element is written by exactly one
// thread, which sums its inputs in a fixed order (j = 0..k-1).
//
// Bytes each kernel must move (N = kept assignments, T tokens, A = T*k, d hidden, b bytes/elem):
//   plan (dropless): read 2*A*8 + tiles*E*8, write 2*A*8 (+ tiles*E*4 counts)
//   permute fwd:   read T*d*b + A*8, write N*d*b          (x read once per token)
//   permute bwd:   read N*d*b + A*8, write T*d*b
//   combine fwd:   read N*d*b + A*12, write T*d*b
//   combine bwd:   read T*d*b + N*d*b + A*12, write N*d*b + A*4   (grad_out read once per token)
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>

#include "device_helpers.cuh"
#include "moe/kernels/kernel_args.h"
#include "moe/kernels/permute.h"
#include "moe/kernels/permute_token.h"

namespace moe::kernels {
namespace {

constexpr int kThreads = 256;

// ---- kernels ----------------------------------------------------------------------------

// rows_of_assignment[source_assignment[r]] = r; entries of dropped assignments stay -1.
__global__ void invert_assignment_kernel(const int64_t* __restrict__ source_assignment, int64_t n,
                                         int64_t num_assignments,
                                         int64_t* __restrict__ rows_of_assignment) {
  int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const int64_t a = source_assignment[r];
  MOE_DEVICE_ASSERT(a >= 0 && a < num_assignments);
  if (a >= 0 && a < num_assignments) rows_of_assignment[a] = r;
}

// Dispatch plan, dropless: assignment a = t*k + j goes to expert e = topk_idx[a]. Destination
// rows are expert-contiguous and stable (ascending a within an expert) without atomics: one warp
// owns a tile of kPlanTile consecutive assignments and walks it 32 at a time; lanes holding the
// same expert find each other with __match_any_sync, take ranks by lane order, and the lowest
// such lane advances that expert's running count. Pass 1 writes each tile's per-expert counts;
// an exclusive scan over tiles (ATen, integer) gives each tile's first row per expert; pass 2
// repeats the walk and writes source_assignment / source_token at the final rows.
constexpr int kPlanTile = 1024;
constexpr int kPlanWarps = 4;  // tiles per block

template <bool kWrite>
__global__ void plan_tiles_kernel(const int64_t* __restrict__ topk_idx, int64_t A, int64_t k, int E,
                                  int* __restrict__ tile_counts,
                                  const int64_t* __restrict__ tile_base,
                                  int64_t* __restrict__ source_assignment,
                                  int64_t* __restrict__ source_token) {
  extern __shared__ int running_all[];  // kPlanWarps x E
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = int64_t(blockIdx.x) * kPlanWarps + warp;
  int* running = running_all + warp * E;
  for (int e = lane; e < E; e += 32) running[e] = 0;
  __syncwarp();
  const int64_t begin = tile * kPlanTile;
  if (begin < A) {  // uniform per warp
    const int64_t end = min(begin + kPlanTile, A);
    for (int64_t base = begin; base < end; base += 32) {
      const int64_t a = base + lane;
      // An id outside [0, E) would index `running` out of bounds: it is treated as "no
      // assignment" (its rows stay unwritten; argument checks report it, see kernel_args.h).
      const int64_t id = a < end ? topk_idx[a] : -1;
      MOE_DEVICE_ASSERT(a >= end || (id >= 0 && id < E));
      const int e = id >= 0 && id < E ? static_cast<int>(id) : -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int rank = __popc(same & ((1u << lane) - 1u));
      if (e >= 0) {
        if (kWrite) {
          const int64_t row = tile_base[tile * E + e] + running[e] + rank;
          source_assignment[row] = a;
          source_token[row] = a / k;
        }
      }
      __syncwarp();
      if (e >= 0 && rank == 0) running[e] += __popc(same);  // one lane per expert
      __syncwarp();
    }
  }
  if (!kWrite) {
    for (int e = lane; e < E; e += 32) tile_counts[tile * E + e] = running[e];
  }
}

// ---- the per-token row kernels (bodies in moe/kernels/permute_token.h) -------------------
// Token t = blockIdx.x * tokens_per_block + threadIdx.x / lanes; its `lanes` threads split the
// row's packs. Out-of-range rows are asserted in debug builds and skipped in release (the body
// treats them as dropped).

namespace tr = token_rows;

__device__ inline void assert_rows(const int64_t* rows_t, int64_t k, int64_t n) {
#ifndef NDEBUG
  for (int64_t j = 0; j < k; ++j) MOE_DEVICE_ASSERT(rows_t[j] >= -1 && rows_t[j] < n);
#else
  (void)rows_t, (void)k, (void)n;
#endif
}

// permute forward: out[rows[t*k + j]] = x[t] for each kept j (x read once per token).
template <int K, int V, typename T>
__global__ void scatter_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ rows,
                                    int64_t tokens, int64_t k, int64_t n, tr::TokenLayout l,
                                    T* __restrict__ out) {
  const int64_t t = int64_t(blockIdx.x) * l.tokens_per_block + threadIdx.x / l.lanes;
  if (t >= tokens) return;
  assert_rows(rows + t * k, k, n);
  tr::scatter_row_lane<K, V>(x + t * l.row_vecs * V, n, rows + t * k, k, l,
                             static_cast<int>(threadIdx.x % l.lanes), out);
}

// combine forward (weights != nullptr): out[t] = sum_j w[t, j] * src[rows[t*k + j]];
// permute backward (weights == nullptr): grad_x[t] = sum_j grad[rows[t*k + j]]. fp32 sums.
template <int K, int V, typename T>
__global__ void sum_rows_kernel(const T* __restrict__ src, const int64_t* __restrict__ rows,
                                const float* __restrict__ weights, int64_t tokens, int64_t k,
                                int64_t n, tr::TokenLayout l, T* __restrict__ out) {
  const int64_t t = int64_t(blockIdx.x) * l.tokens_per_block + threadIdx.x / l.lanes;
  if (t >= tokens) return;
  assert_rows(rows + t * k, k, n);
  tr::sum_rows_lane<K, V>(src, n, rows + t * k, weights != nullptr ? weights + t * k : nullptr, k,
                          l, static_cast<int>(threadIdx.x % l.lanes), out + t * l.row_vecs * V);
}

// combine backward, per token t and kept assignment j (row r):
//   grad_y[r] = w[t, j] * grad_out[t];  grad_w[t, j] = dot(grad_out[t], y[r]) (0 if dropped).
// grad_out[t] is read once for all k. Each lane's fmaf chain is reduced across the token's
// lanes by an xor butterfly (fixed order: deterministic). Threads past the last token still
// take part in the shuffles (full-warp mask), with nothing to add.
template <int K, int V, typename T>
__global__ void combine_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ y,
                                        const int64_t* __restrict__ rows,
                                        const float* __restrict__ weights, int64_t tokens,
                                        int64_t k, int64_t n, tr::TokenLayout l,
                                        T* __restrict__ grad_y, float* __restrict__ grad_w) {
  const int64_t t = int64_t(blockIdx.x) * l.tokens_per_block + threadIdx.x / l.lanes;
  const bool active = t < tokens;
  const int64_t tt = active ? t : 0;
  const int lane = static_cast<int>(threadIdx.x % l.lanes);
  if (active) assert_rows(rows + t * k, k, n);
  for (int64_t j0 = 0; j0 < (K > 0 ? K : k); j0 += tr::chunk_step<K>()) {
    const tr::Chunk<K> c = tr::load_chunk<K>(rows + tt * k, weights + tt * k, j0, k, n);
    float dots[tr::Chunk<K>::kSlots];
    if (active) {
      tr::combine_backward_lane<K, V>(grad_out + t * l.row_vecs * V, y, c, l, lane, grad_y, dots);
    } else {
#pragma unroll
      for (int jj = 0; jj < tr::Chunk<K>::kSlots; ++jj) dots[jj] = 0.f;
    }
#pragma unroll
    for (int jj = 0; jj < tr::Chunk<K>::kSlots; ++jj) {
      for (int offset = l.lanes / 2; offset > 0; offset /= 2) {
        dots[jj] += __shfl_xor_sync(0xffffffffu, dots[jj], offset);
      }
    }
    if (active && lane == 0) {
#pragma unroll
      for (int jj = 0; jj < tr::Chunk<K>::kSlots; ++jj) {
        const int64_t j = j0 + jj;
        if (K > 0 || j < k) grad_w[t * k + j] = c.kept[jj] ? dots[jj] : 0.f;
      }
    }
  }
}

// ---- checked launchers -------------------------------------------------------------------

void check_cuda_2d(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "moe kernels: ", name, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 2, "moe kernels: ", name, " must be 2-D, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "moe kernels: ", name, " must be contiguous");
}

void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kLong && t.dim() == 1, "moe kernels: ", name,
              " must be a 1-D int64 CUDA tensor, got ", t.scalar_type(), " of shape ", t.sizes(),
              " on ", t.device());
}

int blocks_for(int64_t n, const char* kernel) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  check_grid(blocks, n, kernel);
  return static_cast<int>(blocks);
}

// NaN (floating point) or -1 (integers): a test that asks for poisoned outputs sees every
// element the kernel failed to write.
void poison_fill(at::Tensor& t) {
  if (at::isFloatingType(t.scalar_type())) {
    t.fill_(NAN);
  } else {
    t.fill_(-1);
  }
}

using token_rows::rows_aligned16;
using token_rows::with_row_dtype;
using token_rows::with_row_shape;

unsigned row_blocks(int64_t tokens, const token_rows::TokenLayout& l, const char* kernel) {
  const int64_t blocks = (tokens + l.tokens_per_block - 1) / l.tokens_per_block;
  check_grid(blocks, tokens, kernel);
  return static_cast<unsigned>(blocks);
}

}  // namespace

// ---- tensor-level wrappers ---------------------------------------------------------------
namespace detail {

at::Tensor assignment_rows(const at::Tensor& source_assignment, int64_t num_assignments) {
  check_index(source_assignment, "source_assignment");
  c10::cuda::CUDAGuard guard(source_assignment.device());
  auto rows = at::full({num_assignments}, -1, source_assignment.options());
  const int64_t n = source_assignment.numel();
  TORCH_CHECK(n <= num_assignments, "moe kernels: ", n, " rows for ", num_assignments,
              " assignments");
  if (n == 0) return rows;
  if (argument_checks()) {
    check_values_in_range(source_assignment, 0, num_assignments, "source_assignment");
  }
  invert_assignment_kernel<<<blocks_for(n, "assignment_rows"), kThreads, 0,
                             at::cuda::getCurrentCUDAStream()>>>(
      source_assignment.data_ptr<int64_t>(), n, num_assignments, rows.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return rows;
}

std::array<at::Tensor, 3> dispatch_plan(const at::Tensor& topk_idx, int64_t num_experts,
                                        bool poison) {
  TORCH_CHECK(topk_idx.is_cuda() && topk_idx.scalar_type() == at::kLong && topk_idx.dim() == 2,
              "moe kernels: topk_idx must be a 2-D int64 CUDA tensor, got ", topk_idx.scalar_type(),
              " ", topk_idx.sizes());
  TORCH_CHECK(num_experts >= 1 && num_experts * kPlanWarps * 4 <= 48 * 1024,
              "moe kernels: num_experts = ", num_experts, " must be in [1, ",
              48 * 1024 / (kPlanWarps * 4), "] for the dispatch plan");
  const c10::cuda::CUDAGuard guard(topk_idx.device());
  const auto idx = topk_idx.contiguous();
  const int64_t A = idx.numel(), k = idx.size(1), E = num_experts;
  const int64_t tiles = std::max<int64_t>(1, (A + kPlanTile - 1) / kPlanTile);
  const int64_t blocks = (tiles + kPlanWarps - 1) / kPlanWarps;
  check_grid(blocks, A, "dispatch_plan");
  if (argument_checks()) check_values_in_range(idx, 0, E, "topk_idx (expert ids)");
  auto opts = idx.options();
  // Blocks cover kPlanWarps tiles; trailing warps past the last tile count nothing, so the
  // count buffer is sized for all of them.
  auto tile_counts = at::zeros({blocks * kPlanWarps, E}, opts.dtype(at::kInt));
  auto source_assignment = at::empty({A}, opts), source_token = at::empty({A}, opts);
  if (poison) {
    poison_fill(source_assignment);
    poison_fill(source_token);
  }
  const size_t smem = static_cast<size_t>(kPlanWarps * E) * sizeof(int);
  auto stream = at::cuda::getCurrentCUDAStream();
  plan_tiles_kernel<false><<<static_cast<unsigned>(blocks), kPlanWarps * 32, smem, stream>>>(
      idx.data_ptr<int64_t>(), A, k, static_cast<int>(E), tile_counts.data_ptr<int>(), nullptr,
      nullptr, nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // First row of tile b for expert e: rows of all earlier experts, then of e in earlier tiles.
  auto counts = tile_counts.to(at::kLong);
  auto tokens_per_expert = counts.sum(0);
  auto expert_start = tokens_per_expert.cumsum(0) - tokens_per_expert;
  auto tile_base = (counts.cumsum(0) - counts + expert_start.unsqueeze(0)).contiguous();
  plan_tiles_kernel<true><<<static_cast<unsigned>(blocks), kPlanWarps * 32, smem, stream>>>(
      idx.data_ptr<int64_t>(), A, k, static_cast<int>(E), nullptr, tile_base.data_ptr<int64_t>(),
      source_assignment.data_ptr<int64_t>(), source_token.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {source_token, source_assignment, tokens_per_expert};
}

at::Tensor permute_forward(const at::Tensor& x, const at::Tensor& rows_of_assignment, int64_t top_k,
                           int64_t num_rows, bool poison) {
  check_cuda_2d(x, "x");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(top_k >= 1 && rows_of_assignment.numel() == x.size(0) * top_k,
              "moe kernels: permute: ", rows_of_assignment.numel(), " assignments for ", x.size(0),
              " tokens x top_k ", top_k);
  TORCH_CHECK(num_rows >= 0 && num_rows <= rows_of_assignment.numel(),
              "moe kernels: permute: ", num_rows, " rows for ", rows_of_assignment.numel(),
              " assignments");
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t T = x.size(0), d = x.size(1);
  auto out = at::empty({num_rows, d}, x.options());
  if (poison) poison_fill(out);
  if (T == 0 || d == 0 || num_rows == 0) return out;
  if (argument_checks()) {
    check_values_in_range(rows_of_assignment, -1, num_rows, "rows_of_assignment");
  }
  const auto l = token_rows::token_layout(
      d, x.element_size(), rows_aligned16(d, x.element_size(), {x.data_ptr(), out.data_ptr()}));
  const unsigned blocks = row_blocks(T, l, "permute_forward");
  auto stream = at::cuda::getCurrentCUDAStream();
  with_row_dtype(x.scalar_type(), "permute", [&](auto tag) {
    using T_ = decltype(tag);
    with_row_shape<T_>(top_k, l.vec, [&](auto K, auto V) {
      scatter_rows_kernel<decltype(K)::value, decltype(V)::value, T_>
          <<<blocks, token_rows::kThreads, 0, stream>>>(x.data_ptr<T_>(),
                                                        rows_of_assignment.data_ptr<int64_t>(), T,
                                                        top_k, num_rows, l, out.data_ptr<T_>());
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

namespace {
// permute backward and combine forward: out[t] = sum over token t's kept rows of src (weighted
// when weights is defined).
at::Tensor sum_rows(const at::Tensor& src, const at::Tensor& rows_of_assignment,
                    const at::Tensor& weights, int64_t top_k, bool poison, const char* kernel) {
  const int64_t T = rows_of_assignment.numel() / top_k, d = src.size(1), n = src.size(0);
  auto out = at::empty({T, d}, src.options());
  if (poison) poison_fill(out);
  if (T == 0 || d == 0) return out;
  if (argument_checks()) check_values_in_range(rows_of_assignment, -1, n, "rows_of_assignment");
  const auto l = token_rows::token_layout(
      d, src.element_size(),
      rows_aligned16(d, src.element_size(), {src.data_ptr(), out.data_ptr()}));
  const unsigned blocks = row_blocks(T, l, kernel);
  auto stream = at::cuda::getCurrentCUDAStream();
  const float* w = weights.defined() ? weights.data_ptr<float>() : nullptr;
  with_row_dtype(src.scalar_type(), kernel, [&](auto tag) {
    using T_ = decltype(tag);
    with_row_shape<T_>(top_k, l.vec, [&](auto K, auto V) {
      sum_rows_kernel<decltype(K)::value, decltype(V)::value, T_>
          <<<blocks, token_rows::kThreads, 0, stream>>>(src.data_ptr<T_>(),
                                                        rows_of_assignment.data_ptr<int64_t>(), w,
                                                        T, top_k, n, l, out.data_ptr<T_>());
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
}  // namespace

at::Tensor permute_backward(const at::Tensor& grad_out, const at::Tensor& rows_of_assignment,
                            int64_t top_k, bool poison) {
  check_cuda_2d(grad_out, "grad_out");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(top_k >= 1 && rows_of_assignment.numel() % top_k == 0, "moe kernels: top_k = ", top_k,
              " does not divide ", rows_of_assignment.numel(), " assignments");
  c10::cuda::CUDAGuard guard(grad_out.device());
  return sum_rows(grad_out, rows_of_assignment, at::Tensor(), top_k, poison, "permute_backward");
}

at::Tensor combine_forward(const at::Tensor& y, const at::Tensor& rows_of_assignment,
                           const at::Tensor& weights, bool poison) {
  check_cuda_2d(y, "y");
  check_cuda_2d(weights, "weights");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(weights.scalar_type() == at::kFloat, "moe kernels: weights must be fp32, got ",
              weights.scalar_type());
  TORCH_CHECK(weights.numel() == rows_of_assignment.numel() && weights.size(1) >= 1,
              "moe kernels: weights hold ", weights.numel(), " entries for ",
              rows_of_assignment.numel(), " assignments");
  c10::cuda::CUDAGuard guard(y.device());
  return sum_rows(y, rows_of_assignment, weights, weights.size(1), poison, "combine_forward");
}

std::pair<at::Tensor, at::Tensor> combine_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                                   const at::Tensor& rows_of_assignment,
                                                   const at::Tensor& weights, bool poison) {
  check_cuda_2d(grad_out, "grad_out");
  check_cuda_2d(y, "y");
  check_cuda_2d(weights, "weights");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(weights.scalar_type() == at::kFloat, "moe kernels: weights must be fp32, got ",
              weights.scalar_type());
  TORCH_CHECK(grad_out.size(1) == y.size(1) && grad_out.scalar_type() == y.scalar_type() &&
                  weights.size(0) == grad_out.size(0) && weights.size(1) >= 1 &&
                  rows_of_assignment.numel() == weights.numel(),
              "moe kernels: combine backward: grad_out ", grad_out.sizes(), " ",
              grad_out.scalar_type(), ", y ", y.sizes(), " ", y.scalar_type(), ", weights ",
              weights.sizes(), ", ", rows_of_assignment.numel(), " assignment rows");
  c10::cuda::CUDAGuard guard(y.device());
  const int64_t n = y.size(0), d = y.size(1), T = weights.size(0), k = weights.size(1);
  auto grad_y = at::empty_like(y);
  // Every entry of grad_w is written: a dropped assignment receives no row, so its 0 is part of
  // the result.
  auto grad_w = at::empty(weights.sizes(), weights.options());
  if (poison) {
    poison_fill(grad_y);
    poison_fill(grad_w);
  }
  if (T == 0) return {grad_y, grad_w};
  if (d == 0) return {grad_y, grad_w.zero_()};
  if (argument_checks()) check_values_in_range(rows_of_assignment, -1, n, "rows_of_assignment");
  const auto l = token_rows::token_layout(
      d, y.element_size(),
      rows_aligned16(d, y.element_size(), {grad_out.data_ptr(), y.data_ptr(), grad_y.data_ptr()}));
  const unsigned blocks = row_blocks(T, l, "combine_backward");
  auto stream = at::cuda::getCurrentCUDAStream();
  with_row_dtype(y.scalar_type(), "combine backward", [&](auto tag) {
    using T_ = decltype(tag);
    with_row_shape<T_>(k, l.vec, [&](auto K, auto V) {
      combine_backward_kernel<decltype(K)::value, decltype(V)::value, T_>
          <<<blocks, token_rows::kThreads, 0, stream>>>(
              grad_out.data_ptr<T_>(), y.data_ptr<T_>(), rows_of_assignment.data_ptr<int64_t>(),
              weights.data_ptr<float>(), T, k, n, l, grad_y.data_ptr<T_>(),
              grad_w.data_ptr<float>());
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_y, grad_w};
}

}  // namespace detail
}  // namespace moe::kernels
