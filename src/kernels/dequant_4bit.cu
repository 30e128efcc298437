// The 4-bit dequantization kernel and its launch (detail::dequantize_4bit_launch; the argument
// checks, detail::dequantize_4bit_cuda and the dispatch are in dequant_4bit_ops.cpp: nvcc builds
// this file as C++17 and the quant/ headers are C++20). Elementwise: one thread per 16-byte pack of
// the output (or per code byte), the per-thread body shared with the CPU emulation
// (moe/kernels/dequant_4bit_pack.h). Bytes moved for n values: n / 2 of codes, n / 64 x 4 of absmax
// (n / 64 + n / 16384 x 4 under double quant), n x b written. The reference reads and writes the
// values ~6 times over (nibbles, stack, gather, padding, the product, the cast).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "moe/kernels/dequant_4bit_pack.h"
#include "moe/kernels/kernel_args.h"

namespace moe::kernels {
namespace {

namespace dq = dequant_4bit_rows;
constexpr int kThreads = 256;

template <int V, typename T>
__global__ void dequant_4bit_kernel(dq::Dequant4bitShape s, dq::Dequant4bitArgs a,
                                    dq::Dequant4bitTables tables, T* __restrict__ out,
                                    int64_t threads) {
  // The tables in shared memory: the code lookups diverge across a warp, which the parameter
  // (constant) bank would serialise.
  __shared__ float code[dq::kCodes];
  __shared__ float dyn[dq::kDynamic];
  for (int k = threadIdx.x; k < dq::kDynamic; k += blockDim.x) {
    dyn[k] = tables.dyn[k];
    if (k < dq::kCodes) code[k] = tables.code[k];
  }
  __syncthreads();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) dq::dequant_4bit_thread<V, T>(s, a.codes, code, dq::BlockAbsmax{a, dyn}, out, i);
}

template <typename T>
void launch(const dq::Dequant4bitShape& s, const dq::Dequant4bitArgs& a,
            const dq::Dequant4bitTables& tables, T* out) {
  const int64_t threads = dq::thread_count(s);
  if (threads == 0) return;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  check_grid(blocks, threads, "dequantize_4bit");
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  if (s.vec == kPack) {
    dequant_4bit_kernel<kPack, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, a, tables, out, threads);
  } else {
    dequant_4bit_kernel<2, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, a, tables, out, threads);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

namespace detail {

void dequantize_4bit_launch(const dq::Dequant4bitShape& s, const dq::Dequant4bitArgs& a,
                            const dq::Dequant4bitTables& tables, const at::Tensor& out) {
  TORCH_CHECK(out.is_cuda(), "moe kernels: dequantize_4bit: the output must be a CUDA tensor");
  c10::cuda::CUDAGuard guard(out.device());
  token_rows::with_row_dtype(out.scalar_type(), "dequantize_4bit", [&](auto tag) {
    using T = decltype(tag);
    launch<T>(s, a, tables, out.data_ptr<T>());
  });
}

}  // namespace detail
}  // namespace moe::kernels
