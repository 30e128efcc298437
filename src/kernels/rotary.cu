// The rotary family's kernel and raw launch (detail::rotary_apply; autograd op in
// rotary_ops.cpp). One pass over q or k: each thread reads one 16-byte pack of a row's first
// half and the matching pack of its second half, and writes both outputs (the per-thread body,
// shared with the CPU emulation, is moe/kernels/rotary_pack.h). Deterministic: every output
// element has one writer and no sums span threads.
//
// Bytes it must move (R = B*N*S rows, hd head_dim, b bytes/elem): read R*hd*b (+ the cos/sin
// tables, S*hd*b each, or B*S*hd*b per document), write R*hd*b, forward and backward alike. The
// ATen reference moves about five times that in each direction (neg, cat, two products, a sum).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "moe/kernels/kernel_args.h"
#include "moe/kernels/rotary.h"

namespace moe::kernels {
namespace {

constexpr int kThreads = 256;

template <int V, typename T>
__global__ void rotary_kernel(const T* __restrict__ x, const T* __restrict__ cos,
                              const T* __restrict__ sin, T* __restrict__ out,
                              rotary_rows::RotaryShape s, int64_t threads, bool backward) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) rotary_rows::rotary_thread<V, T>(x, cos, sin, out, s, i, backward);
}

}  // namespace

namespace detail {

at::Tensor rotary_apply(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                        bool backward, bool poison) {
  TORCH_CHECK(x_in.is_cuda() && cos.is_cuda() && sin.is_cuda(),
              "moe kernels: rotary: x, cos and sin must be CUDA tensors, got ", x_in.device());
  // A gradient may arrive with any strides; the kernel wants the last dimension contiguous.
  const at::Tensor x = x_in.dim() == 4 && x_in.stride(3) != 1 ? x_in.contiguous() : x_in;
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = rotary_output(x);
  if (poison) out.fill_(NAN);
  const rotary_rows::RotaryShape s = rotary_shape(x, cos, sin, out);
  const int64_t threads = rotary_rows::thread_count(s);
  if (threads == 0) return out;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  check_grid(blocks, threads, "rotary");
  auto stream = at::cuda::getCurrentCUDAStream();
  token_rows::with_row_dtype(x.scalar_type(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kPack = static_cast<int>(16 / sizeof(T));
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          x.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), out.data_ptr<T>(), s, threads,
          backward);
    };
    if (s.vec == kPack) {
      launch(rotary_kernel<kPack, T>);
    } else {
      launch(rotary_kernel<1, T>);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace detail
}  // namespace moe::kernels
