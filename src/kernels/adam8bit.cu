// The 8-bit blockwise AdamW step (include/moe/kernels/adam8bit.h). One thread block per
// 256-value quantisation block, one value per thread: the moments are read as codes (1 B each)
// and written back as codes, so the step moves 4 + 4 + 1 + 1 bytes in and 4 + 1 + 1 out per
// value (plus one absmax per block each way), against 6 ATen passes over fp32 copies in the
// reference. Arithmetic in the reference's order (ATen's CPU kernels): m = fma(g, 1 - b1, m b1)
// (add_ with alpha is a fused multiply-add there), v = v b2 + ((1 - b2) g) g (addcmul_),
// p = p + (step_size m) / denom (addcdiv_); the requantisation multiplies by the reciprocal of
// the block's absmax, clamps to [-1, 1] and takes the nearest code by the midpoints (a value on a
// midpoint takes the lower code), as bucketize does.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "moe/kernels/adam8bit.h"

namespace moe::kernels {
namespace {

constexpr int kBlock = 256;  // values per quantisation block = threads per thread block
constexpr int kWarps = kBlock / 32;

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next call
  return r;
}

// The number of midpoints strictly below x (bucketize, right = false): the nearest code.
__device__ __forceinline__ uint8_t nearest_code(float x, const float* bounds) {
  int lo = 0, hi = kBlock - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (bounds[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint8_t>(lo);
}

__global__ void adam8bit_step_kernel(float* __restrict__ param, const float* __restrict__ grad,
                                     uint8_t* __restrict__ m_codes, float* __restrict__ m_absmax,
                                     uint8_t* __restrict__ v_codes, float* __restrict__ v_absmax,
                                     const float* __restrict__ signed_map,
                                     const float* __restrict__ unsigned_map, int64_t n,
                                     Adam8bitScalars s) {
  __shared__ float smap[kBlock], umap[kBlock], sbound[kBlock - 1], ubound[kBlock - 1];
  __shared__ float scratch[kWarps];
  const int tid = threadIdx.x;
  smap[tid] = signed_map[tid];
  umap[tid] = unsigned_map[tid];
  __syncthreads();
  if (tid < kBlock - 1) {
    sbound[tid] = __fdiv_rn(__fadd_rn(smap[tid], smap[tid + 1]), 2.0f);
    ubound[tid] = __fdiv_rn(__fadd_rn(umap[tid], umap[tid + 1]), 2.0f);
  }
  const int64_t b = blockIdx.x;
  const int64_t i = b * kBlock + tid;
  const bool in = i < n;
  float m = 0.0f, v = 0.0f;
  if (in) {
    float g = grad[i];
    if (s.grad_scale != 1.0f) g = __fdiv_rn(g, s.grad_scale);
    m = __fmul_rn(smap[m_codes[i]], m_absmax[b]);
    v = __fmul_rn(umap[v_codes[i]], v_absmax[b]);
    m = __fmaf_rn(g, s.one_minus_beta1, __fmul_rn(m, s.beta1));
    v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.correction2), s.eps);
    float p = param[i];
    if (s.weight_decay) p = __fmul_rn(p, s.decay);
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
  }
  const float amax_m = block_max(fabsf(m), scratch);  // out-of-range threads hold 0
  const float amax_v = block_max(fabsf(v), scratch);
  if (tid == 0) {
    m_absmax[b] = amax_m;
    v_absmax[b] = amax_v;
  }
  if (in) {
    const float rm = __frcp_rn(fmaxf(amax_m, 1e-38f)), rv = __frcp_rn(fmaxf(amax_v, 1e-38f));
    m_codes[i] = nearest_code(fminf(fmaxf(__fmul_rn(m, rm), -1.0f), 1.0f), sbound);
    v_codes[i] = nearest_code(fminf(fmaxf(__fmul_rn(v, rv), -1.0f), 1.0f), ubound);
  }
}

void check(const at::Tensor& t, at::ScalarType dtype, int64_t numel, const at::Device& device,
           const char* what) {
  TORCH_CHECK(t.scalar_type() == dtype, "adam8bit_step: ", what, " must be ", c10::toString(dtype),
              ", got ", t.scalar_type());
  TORCH_CHECK(t.numel() == numel, "adam8bit_step: ", what, " must have ", numel, " values, got ",
              t.numel());
  TORCH_CHECK(t.device() == device, "adam8bit_step: ", what, " is on ", t.device(),
              ", the parameter on ", device);
  TORCH_CHECK(t.is_contiguous(), "adam8bit_step: ", what, " must be contiguous");
}

}  // namespace

namespace detail {

void adam8bit_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& m_codes,
                   at::Tensor& m_absmax, at::Tensor& v_codes, at::Tensor& v_absmax,
                   const at::Tensor& signed_map, const at::Tensor& unsigned_map,
                   const Adam8bitScalars& s) {
  TORCH_CHECK(param.is_cuda(), "adam8bit_step: the parameter must be on a CUDA device");
  const int64_t n = param.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const at::Device device = param.device();
  check(param, at::kFloat, n, device, "param");
  check(grad, at::kFloat, n, device, "grad");
  check(m_codes, at::kByte, n, device, "m_codes");
  check(v_codes, at::kByte, n, device, "v_codes");
  check(m_absmax, at::kFloat, blocks, device, "m_absmax");
  check(v_absmax, at::kFloat, blocks, device, "v_absmax");
  check(signed_map, at::kFloat, kBlock, device, "signed_map");
  check(unsigned_map, at::kFloat, kBlock, device, "unsigned_map");
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  adam8bit_step_kernel<<<static_cast<unsigned>(blocks), kBlock, 0,
                         at::cuda::getCurrentCUDAStream()>>>(
      param.data_ptr<float>(), grad.data_ptr<float>(), m_codes.data_ptr<uint8_t>(),
      m_absmax.data_ptr<float>(), v_codes.data_ptr<uint8_t>(), v_absmax.data_ptr<float>(),
      signed_map.data_ptr<float>(), unsigned_map.data_ptr<float>(), n, s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace detail
}  // namespace moe::kernels
