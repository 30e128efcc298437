// Float arithmetic rounded where an ATen elementwise op rounds it, shared by the kernels'
// per-thread bodies (rotary_pack.h, swiglu_pack.h) and their CPU emulations. On the device each
// operation is a round-to-nearest intrinsic: nvcc would otherwise contract a * b + c into an fma,
// which rounds once where a chain of ATen ops rounds twice. On the host the emulation compiles with
// -ffp-contract=off, so the plain operators round each step.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>

namespace moe::kernels::rounding {

C10_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

C10_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

C10_HOST_DEVICE inline float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

C10_HOST_DEVICE inline float div_rn(float a, float b) {  // IEEE division (no fast-math reciprocal)
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// a * b + c rounded once: where ATen's own kernel is one expression nvcc contracts.
C10_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// A value rounded to T and back, as an ATen op on T tensors stores it.
template <typename T>
C10_HOST_DEVICE inline float in_t(float v) {
  return static_cast<float>(static_cast<T>(v));
}

}  // namespace moe::kernels::rounding
