// The MXFP4 dequantization kernel and its launch (detail::dequantize_mxfp4_launch; the argument
// checks, detail::dequantize_mxfp4_cuda and the dispatch are in dequant_mxfp4_ops.cpp, as for the
// 4-bit kernel). Elementwise: one thread per 16-byte pack of the output (or per block byte), the
// per-thread body shared with the CPU emulation (moe/kernels/dequant_mxfp4_pack.h): no tables,
// the e2m1 value and the scale's power of two built from bits. Bytes moved for n values: n / 2 of
// blocks, n / 32 of scales, n x b written. The reference reads and writes the values ~6 times over
// (nibbles, gather, two strided copies, ldexp, the reshape).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "moe/kernels/dequant_mxfp4_pack.h"
#include "moe/kernels/kernel_args.h"

namespace moe::kernels {
namespace {

namespace mx = dequant_mxfp4_rows;
constexpr int kMxfp4Threads = 256;

template <int V, typename T>
__global__ void dequant_mxfp4_kernel(mx::DequantMxfp4Shape s, mx::DequantMxfp4Args a,
                                     T* __restrict__ out, int64_t threads) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) mx::dequant_mxfp4_thread<V, T>(s, a.blocks, mx::BlockScale{a.scales}, out, i);
}

template <typename T>
void launch_mxfp4(const mx::DequantMxfp4Shape& s, const mx::DequantMxfp4Args& a, T* out) {
  const int64_t threads = mx::thread_count(s);
  if (threads == 0) return;
  const int64_t blocks = (threads + kMxfp4Threads - 1) / kMxfp4Threads;
  check_grid(blocks, threads, "dequantize_mxfp4");
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  if (s.vec == kPack) {
    dequant_mxfp4_kernel<kPack, T>
        <<<static_cast<unsigned>(blocks), kMxfp4Threads, 0, stream>>>(s, a, out, threads);
  } else {
    dequant_mxfp4_kernel<2, T>
        <<<static_cast<unsigned>(blocks), kMxfp4Threads, 0, stream>>>(s, a, out, threads);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

namespace detail {

void dequantize_mxfp4_launch(const mx::DequantMxfp4Shape& s, const mx::DequantMxfp4Args& a,
                             const at::Tensor& out) {
  TORCH_CHECK(out.is_cuda(), "moe kernels: dequantize_mxfp4: the output must be a CUDA tensor");
  c10::cuda::CUDAGuard guard(out.device());
  token_rows::with_row_dtype(out.scalar_type(), "dequantize_mxfp4", [&](auto tag) {
    using T = decltype(tag);
    launch_mxfp4<T>(s, a, out.data_ptr<T>());
  });
}

}  // namespace detail
}  // namespace moe::kernels
