// The permute family's kernels and raw launches (detail::dispatch_plan, permute_forward/backward,
// combine_forward/backward; autograd ops in permute_ops.cpp).
//
// Layout of this file: kernels, then checked launchers, then tensor-level wrappers.
// Deterministic by construction: no atomics; every output element is written by exactly one
// thread, which sums its inputs in a fixed order (j = 0..k-1).
//
// Byte counts that bound each kernel (N = kept assignments, T tokens, d hidden, b bytes/elem):
//   plan (dropless, A = T*k): read 2*A*8 + tiles*E*8, write 2*A*8 (+ tiles*E*4 counts)
//   permute fwd:   read N*d*b, write N*d*b
//   permute bwd:   read N*d*b, write T*d*b
//   combine fwd:   read N*d*b + T*k*4, write T*d*b
//   combine bwd:   read T*d*b + N*d*b, write N*d*b + N*4
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>

#include "device_helpers.cuh"
#include "moe/kernels/kernel_args.h"
#include "moe/kernels/permute.h"

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

// One block per destination row; copies 16-byte vectors when the row allows (vec_bytes = 16),
// else elements. Row offsets are int64: rows * row_bytes can pass 2^31.
template <typename VecT>
__global__ void gather_rows_kernel(const char* __restrict__ x, const int64_t* __restrict__ src,
                                   int64_t src_rows, int64_t row_vecs, char* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const int64_t s = src[r];
  MOE_DEVICE_ASSERT(s >= 0 && s < src_rows);
  if (s < 0 || s >= src_rows) return;  // uniform per block
  const VecT* in_row = reinterpret_cast<const VecT*>(x) + s * row_vecs;
  VecT* out_row = reinterpret_cast<VecT*>(out) + r * row_vecs;
  for (int64_t i = threadIdx.x; i < row_vecs; i += blockDim.x) out_row[i] = in_row[i];
}

// grad_x[t] = sum_j grad_out[rows[t*k + j]] (rows < 0 skipped), fp32 accumulation.
template <typename scalar_t>
__global__ void permute_backward_kernel(const scalar_t* __restrict__ grad_out,
                                        const int64_t* __restrict__ rows, int64_t n, int64_t k,
                                        int64_t d, scalar_t* __restrict__ grad_x) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t r = rows[t * k + j];
      MOE_DEVICE_ASSERT(r >= -1 && r < n);
      if (r >= 0 && r < n) acc += static_cast<float>(grad_out[r * d + c]);
    }
    grad_x[t * d + c] = static_cast<scalar_t>(acc);
  }
}

// out[t] = sum_j w[t, j] * y[rows[t*k + j]], fp32 accumulation.
template <typename scalar_t>
__global__ void combine_forward_kernel(const scalar_t* __restrict__ y,
                                       const int64_t* __restrict__ rows,
                                       const float* __restrict__ w, int64_t n, int64_t k, int64_t d,
                                       scalar_t* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t r = rows[t * k + j];
      MOE_DEVICE_ASSERT(r >= -1 && r < n);
      if (r >= 0 && r < n) acc += w[t * k + j] * static_cast<float>(y[r * d + c]);
    }
    out[t * d + c] = static_cast<scalar_t>(acc);
  }
}

// One block per destination row r (assignment a, token t):
//   grad_y[r] = w[a] * grad_out[t];  grad_w[a] = dot(grad_out[t], y[r]) (block reduction).
template <typename scalar_t>
__global__ void combine_backward_kernel(const scalar_t* __restrict__ grad_out,
                                        const scalar_t* __restrict__ y,
                                        const int64_t* __restrict__ src_token,
                                        const int64_t* __restrict__ src_assignment,
                                        const float* __restrict__ w, int64_t T, int64_t A,
                                        int64_t d, scalar_t* __restrict__ grad_y,
                                        float* __restrict__ grad_w) {
  __shared__ float partial[kThreads];
  const int64_t r = blockIdx.x;
  const int64_t t = src_token[r];
  const int64_t a = src_assignment[r];
  MOE_DEVICE_ASSERT(t >= 0 && t < T && a >= 0 && a < A);
  if (t < 0 || t >= T || a < 0 || a >= A) return;  // uniform per block
  const float wa = w[a];
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float g = static_cast<float>(grad_out[t * d + c]);
    grad_y[r * d + c] = static_cast<scalar_t>(wa * g);
    dot += g * static_cast<float>(y[r * d + c]);
  }
  partial[threadIdx.x] = dot;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {  // fixed tree order: deterministic
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) grad_w[a] = partial[0];
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

int threads_for_row(int64_t d) {
  int t = 32;
  while (t < kThreads && t < d) t *= 2;
  return t;
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

at::Tensor permute_forward(const at::Tensor& x, const at::Tensor& source_token, bool poison) {
  check_cuda_2d(x, "x");
  check_index(source_token, "source_token");
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = source_token.numel(), d = x.size(1);
  auto out = at::empty({n, d}, x.options());
  if (poison) poison_fill(out);
  if (n == 0 || d == 0) return out;
  check_grid(n, n, "permute_forward");
  if (argument_checks()) check_values_in_range(source_token, 0, x.size(0), "source_token");
  const int64_t row_bytes = d * x.element_size();
  auto stream = at::cuda::getCurrentCUDAStream();
  const bool vec16 = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  const int64_t vec_bytes = vec16 ? 16 : x.element_size();
  const int64_t row_vecs = row_bytes / vec_bytes;
  const int threads = threads_for_row(row_vecs);
  const char* in = static_cast<const char*>(x.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t* src = source_token.data_ptr<int64_t>();
  switch (vec_bytes) {
    case 16:
      gather_rows_kernel<uint4><<<n, threads, 0, stream>>>(in, src, x.size(0), row_vecs, o);
      break;
    case 8:
      gather_rows_kernel<uint2><<<n, threads, 0, stream>>>(in, src, x.size(0), row_vecs, o);
      break;
    case 4:
      gather_rows_kernel<uint32_t><<<n, threads, 0, stream>>>(in, src, x.size(0), row_vecs, o);
      break;
    case 2:
      gather_rows_kernel<uint16_t><<<n, threads, 0, stream>>>(in, src, x.size(0), row_vecs, o);
      break;
    default:
      gather_rows_kernel<uint8_t><<<n, threads, 0, stream>>>(in, src, x.size(0), row_vecs, o);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor permute_backward(const at::Tensor& grad_out, const at::Tensor& rows_of_assignment,
                            int64_t top_k, bool poison) {
  check_cuda_2d(grad_out, "grad_out");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(top_k >= 1 && rows_of_assignment.numel() % top_k == 0, "moe kernels: top_k = ", top_k,
              " does not divide ", rows_of_assignment.numel(), " assignments");
  c10::cuda::CUDAGuard guard(grad_out.device());
  const int64_t T = rows_of_assignment.numel() / top_k, d = grad_out.size(1);
  auto grad_x = at::empty({T, d}, grad_out.options());
  if (poison) poison_fill(grad_x);
  if (T == 0 || d == 0) return grad_x;
  check_grid(T, T, "permute_backward");
  if (argument_checks()) {
    check_values_in_range(rows_of_assignment, -1, grad_out.size(0), "rows_of_assignment");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "permute_bwd", [&] {
        permute_backward_kernel<scalar_t>
            <<<T, threads_for_row(d), 0, at::cuda::getCurrentCUDAStream()>>>(
                grad_out.data_ptr<scalar_t>(), rows_of_assignment.data_ptr<int64_t>(),
                grad_out.size(0), top_k, d, grad_x.data_ptr<scalar_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_x;
}

at::Tensor combine_forward(const at::Tensor& y, const at::Tensor& rows_of_assignment,
                           const at::Tensor& weights, bool poison) {
  check_cuda_2d(y, "y");
  check_cuda_2d(weights, "weights");
  check_index(rows_of_assignment, "rows_of_assignment");
  TORCH_CHECK(weights.scalar_type() == at::kFloat, "moe kernels: weights must be fp32, got ",
              weights.scalar_type());
  TORCH_CHECK(weights.numel() == rows_of_assignment.numel(), "moe kernels: weights hold ",
              weights.numel(), " entries for ", rows_of_assignment.numel(), " assignments");
  c10::cuda::CUDAGuard guard(y.device());
  const int64_t T = weights.size(0), k = weights.size(1), d = y.size(1);
  auto out = at::empty({T, d}, y.options());
  if (poison) poison_fill(out);
  if (T == 0 || d == 0) return out;
  check_grid(T, T, "combine_forward");
  if (argument_checks()) {
    check_values_in_range(rows_of_assignment, -1, y.size(0), "rows_of_assignment");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "combine_fwd", [&] {
    combine_forward_kernel<scalar_t>
        <<<T, threads_for_row(d), 0, at::cuda::getCurrentCUDAStream()>>>(
            y.data_ptr<scalar_t>(), rows_of_assignment.data_ptr<int64_t>(),
            weights.data_ptr<float>(), y.size(0), k, d, out.data_ptr<scalar_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::pair<at::Tensor, at::Tensor> combine_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                                   const at::Tensor& source_token,
                                                   const at::Tensor& source_assignment,
                                                   const at::Tensor& rows_of_assignment,
                                                   const at::Tensor& weights, bool poison) {
  check_cuda_2d(grad_out, "grad_out");
  check_cuda_2d(y, "y");
  check_cuda_2d(weights, "weights");
  check_index(source_token, "source_token");
  check_index(source_assignment, "source_assignment");
  (void)rows_of_assignment;
  TORCH_CHECK(weights.scalar_type() == at::kFloat, "moe kernels: weights must be fp32, got ",
              weights.scalar_type());
  TORCH_CHECK(grad_out.size(1) == y.size(1) && grad_out.scalar_type() == y.scalar_type() &&
                  source_token.numel() == y.size(0) && source_assignment.numel() == y.size(0),
              "moe kernels: combine backward: grad_out ", grad_out.sizes(), " ",
              grad_out.scalar_type(), ", y ", y.sizes(), " ", y.scalar_type(), ", ",
              source_token.numel(), " source tokens, ", source_assignment.numel(),
              " source assignments");
  c10::cuda::CUDAGuard guard(y.device());
  const int64_t n = y.size(0), d = y.size(1);
  auto grad_y = at::empty_like(y);
  if (poison) poison_fill(grad_y);
  // Dropped assignments receive no row, so their weight gradient is 0 (not poisoned: the zero
  // is part of the result).
  auto grad_w = at::zeros(weights.sizes(), weights.options().dtype(at::kFloat));
  if (n == 0) return {grad_y, grad_w};
  check_grid(n, n, "combine_backward");
  if (argument_checks()) {
    check_values_in_range(source_token, 0, grad_out.size(0), "source_token");
    check_values_in_range(source_assignment, 0, weights.numel(), "source_assignment");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "combine_bwd", [&] {
    combine_backward_kernel<scalar_t><<<n, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        grad_out.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), source_token.data_ptr<int64_t>(),
        source_assignment.data_ptr<int64_t>(), weights.data_ptr<float>(), grad_out.size(0),
        weights.numel(), d, grad_y.data_ptr<scalar_t>(), grad_w.data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_y, grad_w};
}

}  // namespace detail
}  // namespace moe::kernels
