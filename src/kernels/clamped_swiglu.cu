// gpt-oss's clamped SwiGLU kernels and raw launches (detail::clamped_swiglu_forward/backward;
// the autograd op in clamped_swiglu_ops.cpp). Elementwise, one 16-byte pack per thread (the
// per-thread bodies, shared with the CPU emulation, are moe/kernels/clamped_swiglu_pack.h, which
// also spells out how each step rounds as the ATen reference's does). Deterministic: every output
// element has one writer.
//
// Bytes moved (n elements of b bytes): forward reads 2 n b and writes n b; backward reads 3 n b
// and writes 2 n b. The ATen reference: seven kernels forward (clamp_max, clamp, mul by alpha,
// sigmoid, mul, add 1, mul: 16 n b) and ten backward (~30 n b with the two where()s and the
// gradient sum), and it keeps g, u + 1, sigmoid's output and the product alive from the forward
// to the backward (4 n b more activation memory per expert FFN; the fused op keeps none).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "moe/kernels/clamped_swiglu.h"
#include "moe/kernels/kernel_args.h"

namespace moe::kernels {
namespace {

namespace rows = clamped_swiglu_rows;

constexpr int kThreads = 256;

template <int V, typename T>
__global__ void clamped_swiglu_forward_kernel(rows::ClampedSwigluParams p,
                                              const T* __restrict__ gate, const T* __restrict__ up,
                                              T* __restrict__ h, int64_t threads) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) rows::clamped_swiglu_forward_thread<V, T>(p, gate, up, h, i);
}

template <int V, typename T>
__global__ void clamped_swiglu_backward_kernel(rows::ClampedSwigluParams p,
                                               const T* __restrict__ dh, const T* __restrict__ gate,
                                               const T* __restrict__ up, T* __restrict__ d_gate,
                                               T* __restrict__ d_up, int64_t threads) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) rows::clamped_swiglu_backward_thread<V, T>(p, dh, gate, up, d_gate, d_up, i);
}

// Runs launch(kernel pack width V as an integral constant, blocks, threads) for the shape's pack
// width.
template <typename T, typename Launch>
void with_pack(const rows::ClampedSwigluShape& s, const char* what, Launch&& launch) {
  const int64_t threads = rows::thread_count(s);
  if (threads == 0) return;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  check_grid(blocks, threads, what);
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  if (s.vec == kPack) {
    launch(std::integral_constant<int, kPack>{}, blocks, threads);
  } else {
    launch(std::integral_constant<int, 1>{}, blocks, threads);
  }
}

void check_cuda(std::initializer_list<const at::Tensor*> ts) {
  const at::Device first = (*ts.begin())->device();
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->is_cuda(), "moe kernels: clamped_swiglu: operands must be CUDA tensors, got ",
                t->device());
    TORCH_CHECK(t->device() == first, "moe kernels: clamped_swiglu: operands on ", first, " and ",
                t->device());
  }
}

template <typename T>
void launch_forward(const rows::ClampedSwigluShape& s, const rows::ClampedSwigluParams& p,
                    const T* gate, const T* up, T* h) {
  auto stream = at::cuda::getCurrentCUDAStream();
  with_pack<T>(s, "clamped_swiglu", [&](auto v, int64_t blocks, int64_t threads) {
    clamped_swiglu_forward_kernel<decltype(v)::value, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, gate, up, h, threads);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch_backward(const rows::ClampedSwigluShape& s, const rows::ClampedSwigluParams& p,
                     const T* dh, const T* gate, const T* up, T* d_gate, T* d_up) {
  auto stream = at::cuda::getCurrentCUDAStream();
  with_pack<T>(s, "clamped_swiglu_backward", [&](auto v, int64_t blocks, int64_t threads) {
    clamped_swiglu_backward_kernel<decltype(v)::value, T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, dh, gate, up, d_gate, d_up,
                                                                 threads);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

namespace detail {

at::Tensor clamped_swiglu_forward(const at::Tensor& gate_in, const at::Tensor& up_in, double limit,
                                  double alpha, bool poison) {
  check_cuda({&gate_in, &up_in});
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor h = at::empty_like(gate, at::MemoryFormat::Contiguous);
  if (poison) h.fill_(NAN);
  const auto s = clamped_swiglu_shape(gate, up, {&h});
  token_rows::with_row_dtype(gate.scalar_type(), "clamped_swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch_forward<T>(s, rows::clamped_swiglu_params<T>(limit, alpha), gate.data_ptr<T>(),
                      up.data_ptr<T>(), h.data_ptr<T>());
  });
  return h;
}

std::pair<at::Tensor, at::Tensor> clamped_swiglu_backward(const at::Tensor& dh_in,
                                                          const at::Tensor& gate_in,
                                                          const at::Tensor& up_in, double limit,
                                                          double alpha, bool poison) {
  check_cuda({&dh_in, &gate_in, &up_in});
  // A gradient may arrive with any strides (or expanded); the kernel reads flat buffers.
  const at::Tensor dh = dh_in.contiguous(), gate = gate_in.contiguous(), up = up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor d_gate = at::empty_like(gate, at::MemoryFormat::Contiguous);
  at::Tensor d_up = at::empty_like(up, at::MemoryFormat::Contiguous);
  if (poison) d_gate.fill_(NAN), d_up.fill_(NAN);
  const auto s = clamped_swiglu_shape(gate, up, {&dh, &d_gate, &d_up});
  token_rows::with_row_dtype(gate.scalar_type(), "clamped_swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_backward<T>(s, rows::clamped_swiglu_params<T>(limit, alpha), dh.data_ptr<T>(),
                       gate.data_ptr<T>(), up.data_ptr<T>(), d_gate.data_ptr<T>(),
                       d_up.data_ptr<T>());
  });
  return {d_gate, d_up};
}

}  // namespace detail
}  // namespace moe::kernels
