#include "dequant_4bit_emulation.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "moe/kernels/dequant_4bit.h"

namespace moe::kernel_emulation {

namespace {

namespace dq = kernels::dequant_4bit_rows;

// Faulty absmax: the double-quant statistics combined wrongly.
struct FmaAbsmax {
  dq::BlockAbsmax good;
  float operator()(const dq::Dequant4bitShape& s, int64_t b) const {
    if (!s.double_quant) return good(s, b);
    const auto& a = good.a;
    return std::fma(good.dyn[a.absmax_q[b]], a.nested_absmax[b / dq::kNestedBlock], *a.offset);
  }
};
struct WrongNestedAbsmax {
  dq::BlockAbsmax good;
  int64_t nested;  // nested absmax values (the wrong index is clamped into them)
  float operator()(const dq::Dequant4bitShape& s, int64_t b) const {
    if (!s.double_quant) return good(s, b);
    const auto& a = good.a;
    const float scaled = good.dyn[a.absmax_q[b]] * a.nested_absmax[std::min(b / 64, nested - 1)];
    return scaled + *a.offset;
  }
};

// Thread i of the launch the shape picks (V = vec).
template <typename T, typename Absmax>
void run_threads(const dq::Dequant4bitShape& s, const uint8_t* codes, const float* code,
                 const Absmax& absmax, T* out, int64_t threads) {
  constexpr int kPack = static_cast<int>(16 / sizeof(T));
  for (int64_t i = 0; i < threads; ++i) {
    if (s.vec == kPack) {
      dq::dequant_4bit_thread<kPack, T>(s, codes, code, absmax, out, i);
    } else {
      dq::dequant_4bit_thread<2, T>(s, codes, code, absmax, out, i);
    }
  }
}

}  // namespace

void dequantize_4bit(const quant::Quantized4bit& q_in, const torch::Tensor& out,
                     Dequant4bitFault fault) {
  using F = Dequant4bitFault;
  quant::Quantized4bit q = q_in;
  if (fault == F::kNibblesSwapped) {
    q.codes = torch::bitwise_or(q.codes.bitwise_left_shift(4), q.codes.bitwise_right_shift(4));
  }
  // The truncated cast: the body's fp32 values, their bf16 by dropping the low 16 bits.
  torch::Tensor target = out;
  if (fault == F::kBf16Truncated && out.scalar_type() == torch::kBFloat16) {
    target = torch::full({out.numel()}, NAN, out.options().dtype(torch::kFloat));
  }
  // As the launcher: the shape, the state's pointers, the tables (shared memory there).
  dq::Dequant4bitShape s = kernels::detail::dequantize_4bit_shape(q, target);
  const dq::Dequant4bitArgs a = kernels::detail::dequantize_4bit_args(q);
  const dq::Dequant4bitTables tables = kernels::detail::dequantize_4bit_tables(q.type);
  const dq::BlockAbsmax good{a, tables.dyn};
  int64_t threads = dq::thread_count(s);
  if (fault == F::kLastThreadSkipped) threads -= 1;
  if (fault == F::kBlockFromByteIndex) s.blocksize *= 2;  // value e's block taken as (e / 2) / bs
  const int64_t nested = q.double_quant() ? q.nested_absmax.numel() : 1;
  kernels::token_rows::with_row_dtype(target.scalar_type(), "dequantize_4bit", [&](auto tag) {
    using T = decltype(tag);
    T* o = target.data_ptr<T>();
    const uint8_t* codes = a.codes;
    if (fault == F::kAbsmaxFma) {
      run_threads<T>(s, codes, tables.code, FmaAbsmax{good}, o, threads);
    } else if (fault == F::kNestedIndexWrong) {
      run_threads<T>(s, codes, tables.code, WrongNestedAbsmax{good, nested}, o, threads);
    } else {
      run_threads<T>(s, codes, tables.code, good, o, threads);
    }
  });
  if (target.data_ptr() != out.data_ptr()) {
    const auto bits = target.view(torch::kInt).bitwise_right_shift(16).to(torch::kShort);
    out.view(torch::kShort).copy_(bits);
  }
}

}  // namespace moe::kernel_emulation
