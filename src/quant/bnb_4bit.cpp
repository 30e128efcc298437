#include "moe/quant/bnb_4bit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "moe/quant/blockwise_quant.h"

namespace moe::quant {

namespace {

// bitsandbytes' code books, as get_4bit_type lists them (Python floats: rounded to fp32 by
// torch.tensor, then divided by their largest magnitude).
constexpr std::array<double, 16> kNf4 = {-1.0,
                                         -0.6961928009986877,
                                         -0.5250730514526367,
                                         -0.39491748809814453,
                                         -0.28444138169288635,
                                         -0.18477343022823334,
                                         -0.09105003625154495,
                                         0.0,
                                         0.07958029955625534,
                                         0.16093020141124725,
                                         0.24611230194568634,
                                         0.33791524171829224,
                                         0.44070982933044434,
                                         0.5626170039176941,
                                         0.7229568362236023,
                                         1.0};
// FP4 (1 sign, 2 exponent, 1 mantissa bit) in bit-pattern order. Code 8 ("-0") is +0.0: their
// list writes it as the Python integer -0, which has no sign.
constexpr std::array<double, 16> kFp4 = {0,   0.0625,  8.0,  12.0,  4.0,  6.0,  2.0,  3.0,
                                         0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0};

// quantize_4bit's nearest-code search (bitsandbytes/backends/default/ops.py): the midpoints of
// the sorted code book and the sort order, the same ATen operations so the same floats.
struct Bounds {
  torch::Tensor midpoints, order;
};
Bounds bounds_of(Quant4bitType type) {
  const auto code = code_4bit(type);
  const auto order = torch::argsort(code);
  const auto sorted = code.index({order});
  return {(sorted.slice(0, 0, 15) + sorted.slice(0, 1, 16)) / 2, order};
}

// quantize_blockwise on the CPU (csrc/cpu_ops.cpp): the nearest code through a 65,536-entry
// table over [-1, 1] built from the code's midpoints, not an exact search. Reproduced as written
// there; separate statements keep each float operation rounded as theirs is.
constexpr int kLutSize = 65536;
std::vector<uint8_t> blockwise_lut(const float* code) {
  std::array<float, 255> mid{};
  for (int i = 0; i < 255; ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<uint8_t> lut(kLutSize);
  int idx = 0;
  for (int i = 0; i < kLutSize; ++i) {
    const float num = 2.0f * static_cast<float>(i);
    const float val = -1.0f + num / static_cast<float>(kLutSize - 1);
    while (idx < 255 && mid[idx] < val) ++idx;
    lut[i] = static_cast<uint8_t>(idx);
  }
  return lut;
}

uint16_t lut_index(float v) {
  v = std::clamp(v, -1.0f, 1.0f);
  const float shifted = v + 1.0f;
  const float half = shifted * 0.5f;
  const float scaled = half * static_cast<float>(kLutSize - 1);
  return static_cast<uint16_t>(scaled + 0.5f);
}

// -> (uint8 codes [n], fp32 absmax [ceil(n / blocksize)]) of fp32 values `a`.
std::pair<torch::Tensor, torch::Tensor> quantize_blockwise(const torch::Tensor& a,
                                                           int64_t blocksize) {
  const auto x = a.to(torch::kCPU, torch::kFloat).contiguous();
  const int64_t n = x.numel(), blocks = (n + blocksize - 1) / blocksize;
  const auto code = dynamic_map();
  static const std::vector<uint8_t> lut = blockwise_lut(code.data_ptr<float>());
  auto out = torch::empty({n}, torch::kUInt8);
  auto absmax = torch::empty({blocks}, torch::kFloat);
  const float* v = x.data_ptr<float>();
  uint8_t* o = out.data_ptr<uint8_t>();
  float* am = absmax.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * blocksize, end = std::min(begin + blocksize, n);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
    am[b] = m;
    if (m == 0.0f) {
      std::fill(o + begin, o + end, uint8_t{0});
      continue;
    }
    const float inv = 1.0f / m;
    for (int64_t i = begin; i < end; ++i) o[i] = lut[lut_index(v[i] * inv)];
  }
  return {out, absmax};
}

}  // namespace

int64_t Quantized4bit::numel() const {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return n;
}

int64_t Quantized4bit::bytes() const {
  int64_t b = codes.nbytes() + absmax.nbytes();
  if (double_quant()) b += nested_absmax.nbytes() + offset.nbytes();
  return b;
}

Quantized4bit Quantized4bit::to(const torch::Device& device) const {
  Quantized4bit q = *this;
  q.codes = codes.to(device);
  q.absmax = absmax.to(device);
  if (double_quant()) {
    q.nested_absmax = nested_absmax.to(device);
    q.offset = offset.to(device);
  }
  return q;
}

torch::Tensor code_4bit(Quant4bitType type) {
  const auto& data = type == Quant4bitType::kNf4 ? kNf4 : kFp4;
  auto code = torch::empty({16}, torch::kFloat);
  for (size_t i = 0; i < data.size(); ++i) code[static_cast<int64_t>(i)] = data[i];
  return code.div_(code.abs().max());
}

torch::Tensor dynamic_map() {
  // The 8-bit optimizer's map (quant/blockwise_quant.h, checked against bitsandbytes there).
  return dynamic_map(/*is_signed=*/true, torch::kCPU);
}

Quantized4bit quantize_4bit(const torch::Tensor& w, Quant4bitType type, bool double_quant,
                            int64_t blocksize) {
  if (blocksize <= 0 || blocksize % 2 != 0) {
    throw std::invalid_argument("quantize_4bit: blocksize must be even and > 0");
  }
  Quantized4bit q;
  q.shape = w.sizes().vec();
  q.type = type;
  q.blocksize = blocksize;
  static const Bounds nf4 = bounds_of(Quant4bitType::kNf4), fp4 = bounds_of(Quant4bitType::kFp4);
  const Bounds& b = type == Quant4bitType::kNf4 ? nf4 : fp4;
  torch::NoGradGuard no_grad;
  const auto flat = w.detach().to(torch::kCPU).reshape(-1).to(torch::kFloat);
  const int64_t n = flat.numel(), rem = n % blocksize, full = n - rem;
  auto whole = flat.slice(0, 0, full).view({full / blocksize, blocksize});
  auto absmax = std::get<0>(whole.abs().max(-1));
  auto scaled =
      torch::clamp(whole * torch::reciprocal(absmax.clamp_min(1e-38)).view({-1, 1}), -1, 1)
          .reshape(-1);
  if (rem > 0) {
    const auto tail = flat.slice(0, full);
    const auto am = tail.abs().max().clamp_min(1e-38);
    absmax = torch::cat({absmax, am.unsqueeze(0)});
    scaled = torch::cat({scaled, torch::clamp(tail / am, -1, 1)});
  }
  if (scaled.numel() % 2 != 0) scaled = torch::constant_pad_nd(scaled, {0, 1});
  auto idx = torch::bucketize(scaled, b.midpoints, /*out_int32=*/true);
  if (type != Quant4bitType::kNf4) idx = b.order.index({idx.to(torch::kLong)});
  const auto q8 = idx.to(torch::kUInt8);
  q.codes = torch::bitwise_or(q8.slice(0, 0, c10::nullopt, 2).bitwise_left_shift(4),
                              q8.slice(0, 1, c10::nullopt, 2));
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  q.offset = absmax.mean();
  auto [nested_codes, nested_absmax] = quantize_blockwise(absmax - q.offset, kNestedBlocksize);
  q.absmax = nested_codes;
  q.nested_absmax = nested_absmax;
  return q;
}

torch::Tensor dequantize_absmax(const Quantized4bit& q) {
  if (!q.double_quant()) return q.absmax;
  const int64_t blocks = q.absmax.numel();
  const int64_t padded = q.nested_absmax.numel() * kNestedBlocksize;
  // dequantize_blockwise (code[q] * absmax, fp32), then + offset: two roundings, as theirs.
  auto v = dynamic_map().to(q.absmax.device()).index({q.absmax.to(torch::kLong)});
  v = torch::constant_pad_nd(v, {0, padded - blocks}).view({-1, kNestedBlocksize});
  v = (v * q.nested_absmax.view({-1, 1})).reshape(-1).slice(0, 0, blocks);
  return v + q.offset;
}

torch::Tensor dequantize_4bit(const Quantized4bit& q, torch::ScalarType dtype) {
  const int64_t n = q.numel();
  const auto high = q.codes.bitwise_right_shift(4), low = q.codes.bitwise_and(15);
  const auto nibbles = torch::stack({high, low}, 1).reshape(-1).to(torch::kLong);
  auto values = code_4bit(q.type).to(q.codes.device()).index({nibbles});
  const int64_t padded = q.blocks() * q.blocksize;
  values = torch::constant_pad_nd(values.slice(0, 0, std::min(n, values.numel())),
                                  {0, padded - std::min(n, values.numel())});
  const auto absmax = dequantize_absmax(q);
  const auto out = (values.view({-1, q.blocksize}) * absmax.view({-1, 1})).reshape(-1);
  return out.slice(0, 0, n).view(q.shape).to(dtype);
}

}  // namespace moe::quant
