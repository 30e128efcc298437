// CPU emulation of the MXFP4 dequantization kernel (dequant_mxfp4_emulation.h).
#include "dequant_mxfp4_emulation.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "moe/kernels/dequant_mxfp4.h"

namespace moe::kernel_emulation {

namespace {

namespace dq = kernels::dequant_mxfp4_rows;

// Faulty scales: block b's factor (twice the e2m1 value times it is the value).
struct OffByOneScale {
  const uint8_t* scales;
  float operator()(int64_t b) const { return 2.0f * dq::half_scale(scales[b]); }
};
struct InfiniteScale {  // e2m1 x 2^(s - 127), 2^128 = inf: the factor inf for byte 255
  const uint8_t* scales;
  float operator()(int64_t b) const {
    return scales[b] == 255 ? std::numeric_limits<float>::infinity() : dq::half_scale(scales[b]);
  }
};
struct FlushedScale {
  const uint8_t* scales;
  float operator()(int64_t b) const { return scales[b] < 2 ? 0.0f : dq::half_scale(scales[b]); }
};
struct ByteIndexScale {  // block of the byte index: (e / 2) / 32
  const uint8_t* scales;
  float operator()(int64_t b) const { return dq::half_scale(scales[b / 2]); }
};

// Thread i of the launch the shape picks (V = vec).
template <typename T, typename Scale>
void run_threads(const dq::DequantMxfp4Shape& s, const uint8_t* blocks, const Scale& scale, T* out,
                 int64_t threads) {
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  for (int64_t i = 0; i < threads; ++i) {
    if (s.vec == kPack) {
      dq::dequant_mxfp4_thread<kPack, T>(s, blocks, scale, out, i);
    } else {
      dq::dequant_mxfp4_thread<2, T>(s, blocks, scale, out, i);
    }
  }
}

// fp32 -> fp16 with the faulty rounding of `fault` (ATen's, round to nearest even, elsewhere).
c10::Half faulty_half(float v, DequantMxfp4Fault fault) {
  using F = DequantMxfp4Fault;
  const float a = std::fabs(v);
  const float sign = std::signbit(v) ? -1.0f : 1.0f;
  if (fault == F::kHalfSubnormalsFlushed && a < 0x1p-14f) return c10::Half(sign * 0.0f);
  if (fault == F::kHalfTiesAway && a < 0x1p-14f) {
    return c10::Half(sign * std::round(a * 0x1p24f) * 0x1p-24f);  // std::round: ties away
  }
  if (fault == F::kHalfSaturated && a > 65504.0f) return c10::Half(sign * 65504.0f);
  return c10::Half(v);
}

}  // namespace

void dequantize_mxfp4(const kernel_checks::Mxfp4Tensors& m_in, const torch::Tensor& out,
                      DequantMxfp4Fault fault) {
  using F = DequantMxfp4Fault;
  kernel_checks::Mxfp4Tensors m = m_in;
  if (fault == F::kHighNibbleFirst) {
    m.blocks = torch::bitwise_or(m.blocks.bitwise_left_shift(4), m.blocks.bitwise_right_shift(4));
  }
  // The faulty fp16 casts: the body's fp32 values, then cast wrongly.
  const bool half_cast = (fault == F::kHalfSubnormalsFlushed || fault == F::kHalfTiesAway ||
                          fault == F::kHalfSaturated) &&
                         out.scalar_type() == torch::kHalf;
  torch::Tensor target = out;
  if (half_cast) {
    target = torch::full({out.numel()}, NAN, out.options().dtype(torch::kFloat));
  }
  // As the launcher: the shape and the buffers' pointers.
  const dq::DequantMxfp4Shape s =
      kernels::detail::dequantize_mxfp4_shape(m.blocks, m.scales, target);
  const dq::DequantMxfp4Args a = kernels::detail::dequantize_mxfp4_args(m.blocks, m.scales);
  int64_t threads = dq::thread_count(s);
  if (fault == F::kLastThreadSkipped) threads -= 1;
  kernels::token_rows::with_row_dtype(target.scalar_type(), "dequantize_mxfp4", [&](auto tag) {
    using T = decltype(tag);
    T* o = target.data_ptr<T>();
    switch (fault) {
      case F::kScaleOffByOne:
        return run_threads<T>(s, a.blocks, OffByOneScale{a.scales}, o, threads);
      case F::kScale255Infinite:
        return run_threads<T>(s, a.blocks, InfiniteScale{a.scales}, o, threads);
      case F::kSubnormalScaleZero:
        return run_threads<T>(s, a.blocks, FlushedScale{a.scales}, o, threads);
      case F::kBlockFromByteIndex:
        return run_threads<T>(s, a.blocks, ByteIndexScale{a.scales}, o, threads);
      default:
        return run_threads<T>(s, a.blocks, dq::BlockScale{a.scales}, o, threads);
    }
  });
  if (half_cast) {
    const float* t = target.data_ptr<float>();
    c10::Half* o = out.data_ptr<c10::Half>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = faulty_half(t[i], fault);
  }
}

}  // namespace moe::kernel_emulation
