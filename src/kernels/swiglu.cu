// The SwiGLU family's kernels (silu or gelu_tanh gates: SwiGLU, GeGLU) and raw launches
// (detail::swiglu_forward/backward and the packed form's swiglu_packed_forward/backward; autograd
// ops in swiglu_ops.cpp). Elementwise, one 16-byte pack per thread (the per-thread bodies, shared
// with the CPU emulation, are moe/kernels/swiglu_pack.h); in the packed form gate and up are the
// two halves of each row. Deterministic: every output element has one writer.
//
// Bytes moved (n elements of b bytes): forward reads 2 n b and writes n b; backward reads 3 n b
// and writes 2 n b. The ATen reference: silu (2 n b) and the product (3 n b) forward; backward
// the product's two gradients (6 n b) and silu_backward (3 n b), and it keeps silu(gate) alive
// from the forward to the backward (n b more activation memory per FFN).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "moe/kernels/kernel_args.h"
#include "moe/kernels/swiglu.h"

namespace moe::kernels {
namespace {

constexpr int kThreads = 256;

using swiglu_rows::Gate;

template <int V, typename T, Gate G>
__global__ void swiglu_forward_kernel(swiglu_rows::SwigluShape s, const T* __restrict__ gate,
                                      const T* __restrict__ up, T* __restrict__ h,
                                      int64_t threads) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) swiglu_rows::swiglu_forward_thread<V, T, G>(s, gate, up, h, i);
}

template <int V, typename T, Gate G>
__global__ void swiglu_backward_kernel(swiglu_rows::SwigluShape s, const T* __restrict__ dh,
                                       const T* __restrict__ gate, const T* __restrict__ up,
                                       T* __restrict__ d_gate, T* __restrict__ d_up,
                                       int64_t threads) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < threads) {
    swiglu_rows::swiglu_backward_thread<V, T, G>(s, dh, gate, up, d_gate, d_up, i);
  }
}

// Runs launch(pack width V, gate G as integral constants, blocks, threads) for the shape's pack
// width and the gate asked for.
template <typename T, typename Launch>
void with_pack(const swiglu_rows::SwigluShape& s, Gate gate, const char* what, Launch&& launch) {
  const int64_t threads = swiglu_rows::thread_count(s);
  if (threads == 0) return;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  check_grid(blocks, threads, what);
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  auto with_gate = [&](auto v) {
    if (gate == Gate::kGeluTanh) {
      launch(v, std::integral_constant<Gate, Gate::kGeluTanh>{}, blocks, threads);
    } else {
      launch(v, std::integral_constant<Gate, Gate::kSilu>{}, blocks, threads);
    }
  };
  if (s.vec == kPack) {
    with_gate(std::integral_constant<int, kPack>{});
  } else {
    with_gate(std::integral_constant<int, 1>{});
  }
}

void check_cuda(std::initializer_list<const at::Tensor*> ts) {
  const at::Device first = (*ts.begin())->device();
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->is_cuda(), "moe kernels: swiglu: operands must be CUDA tensors, got ",
                t->device());
    TORCH_CHECK(t->device() == first, "moe kernels: swiglu: operands on ", first, " and ",
                t->device());
  }
}

// The launches over raw pointers: separate operands and the packed form differ only in where
// gate and up (and their gradients) start and in the shape's row stride.
template <typename T>
void launch_forward(const swiglu_rows::SwigluShape& s, Gate g, const T* gate, const T* up, T* h) {
  auto stream = at::cuda::getCurrentCUDAStream();
  with_pack<T>(s, g, "swiglu", [&](auto v, auto gv, int64_t blocks, int64_t threads) {
    swiglu_forward_kernel<decltype(v)::value, T, decltype(gv)::value>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, gate, up, h, threads);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch_backward(const swiglu_rows::SwigluShape& s, Gate g, const T* dh, const T* gate,
                     const T* up, T* d_gate, T* d_up) {
  auto stream = at::cuda::getCurrentCUDAStream();
  with_pack<T>(s, g, "swiglu_backward", [&](auto v, auto gv, int64_t blocks, int64_t threads) {
    swiglu_backward_kernel<decltype(v)::value, T, decltype(gv)::value>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, dh, gate, up, d_gate, d_up,
                                                                 threads);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

namespace detail {

at::Tensor swiglu_forward(const at::Tensor& gate_in, const at::Tensor& up_in, bool poison, Gate g) {
  check_cuda({&gate_in, &up_in});
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor h = at::empty_like(gate, at::MemoryFormat::Contiguous);
  if (poison) h.fill_(NAN);
  const auto s = swiglu_shape(gate, up, {&h});
  token_rows::with_row_dtype(gate.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    launch_forward<T>(s, g, gate.data_ptr<T>(), up.data_ptr<T>(), h.data_ptr<T>());
  });
  return h;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& dh_in,
                                                  const at::Tensor& gate_in,
                                                  const at::Tensor& up_in, bool poison, Gate g) {
  check_cuda({&dh_in, &gate_in, &up_in});
  // A gradient may arrive with any strides (or expanded); the kernel reads flat buffers.
  const at::Tensor dh = dh_in.contiguous(), gate = gate_in.contiguous(), up = up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor d_gate = at::empty_like(gate, at::MemoryFormat::Contiguous);
  at::Tensor d_up = at::empty_like(up, at::MemoryFormat::Contiguous);
  if (poison) d_gate.fill_(NAN), d_up.fill_(NAN);
  const auto s = swiglu_shape(gate, up, {&dh, &d_gate, &d_up});
  token_rows::with_row_dtype(gate.scalar_type(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_backward<T>(s, g, dh.data_ptr<T>(), gate.data_ptr<T>(), up.data_ptr<T>(),
                       d_gate.data_ptr<T>(), d_up.data_ptr<T>());
  });
  return {d_gate, d_up};
}

at::Tensor swiglu_packed_forward(const at::Tensor& gate_up_in, bool poison, Gate g) {
  check_cuda({&gate_up_in});
  const at::Tensor gate_up = gate_up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate_up.device());
  auto sizes = gate_up.sizes().vec();
  if (!sizes.empty()) sizes.back() /= 2;
  at::Tensor h = at::empty(sizes, gate_up.options());
  if (poison) h.fill_(NAN);
  const auto s = swiglu_packed_shape(gate_up, {&h});
  token_rows::with_row_dtype(gate_up.scalar_type(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    const T* p = gate_up.data_ptr<T>();
    launch_forward<T>(s, g, p, p + s.cols, h.data_ptr<T>());
  });
  return h;
}

at::Tensor swiglu_packed_backward(const at::Tensor& dh_in, const at::Tensor& gate_up_in,
                                  bool poison, Gate g) {
  check_cuda({&dh_in, &gate_up_in});
  const at::Tensor dh = dh_in.contiguous(), gate_up = gate_up_in.contiguous();
  c10::cuda::CUDAGuard guard(gate_up.device());
  at::Tensor d_gate_up = at::empty_like(gate_up, at::MemoryFormat::Contiguous);
  if (poison) d_gate_up.fill_(NAN);
  const auto s = swiglu_packed_shape(gate_up, {&dh}, {&d_gate_up});
  token_rows::with_row_dtype(gate_up.scalar_type(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* p = gate_up.data_ptr<T>();
    T* dg = d_gate_up.data_ptr<T>();
    launch_backward<T>(s, g, dh.data_ptr<T>(), p, p + s.cols, dg, dg + s.cols);
  });
  return d_gate_up;
}

}  // namespace detail
}  // namespace moe::kernels
