// 8-bit blockwise dynamic quantisation (blockwise_quant.h), written after bitsandbytes'
// create_dynamic_map and its default quantize/dequantize ops, operation for operation, so that
// the codes match bitsandbytes' (tests/optim/optimizer_precision_test.py checks them).
#include "moe/quant/blockwise_quant.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace moe::quant {

namespace {

// create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for each exponent i the means
// of linspace(0.1, 1, 2^i + 1) (signed; 2^(i+1) + 1 unsigned) fp32 boundaries, times 10^(i-6),
// and their negatives when signed; then 0 and 1; sorted.
at::Tensor make_dynamic_map(bool is_signed) {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t(1) << i) + 1 : (int64_t(1) << (i + 1)) + 1;
    const at::Tensor b = at::linspace(0.1, 1, items, at::kFloat);
    const at::Tensor means = (b.slice(0, 0, items - 1) + b.slice(0, 1, items)) / 2.0;
    const at::Tensor scaled = means * std::pow(10.0, -6 + i);
    const float* s = scaled.data_ptr<float>();
    for (int64_t k = 0; k < scaled.numel(); ++k) data.push_back(s[k]);
    if (is_signed) {
      const at::Tensor neg = -(std::pow(10.0, -6 + i)) * means;
      const float* n = neg.data_ptr<float>();
      for (int64_t k = 0; k < neg.numel(); ++k) data.push_back(n[k]);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  data.resize(256, 0.0f);
  std::sort(data.begin(), data.end());
  return at::tensor(data, at::kFloat);
}

}  // namespace

at::Tensor dynamic_map(bool is_signed, const at::Device& device) {
  static std::mutex mu;
  static std::map<std::pair<bool, std::string>, at::Tensor> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = cache[{is_signed, device.str()}];
  if (!t.defined()) t = make_dynamic_map(is_signed).to(device);
  return t;
}

int64_t quant_blocks(int64_t numel) { return (numel + kQuantBlock - 1) / kQuantBlock; }

void quantize_blockwise(const at::Tensor& x, const at::Tensor& map, at::Tensor& codes,
                        at::Tensor& absmax) {
  const int64_t n = x.numel();
  const int64_t blocks = quant_blocks(n);
  at::Tensor flat = x.reshape({-1}).to(at::kFloat);
  if (blocks * kQuantBlock != n) {  // the last block's padding (zeros) changes no absmax
    flat = at::cat({flat, at::zeros({blocks * kQuantBlock - n}, flat.options())});
  }
  const at::Tensor rows = flat.view({blocks, kQuantBlock});
  const at::Tensor amax = std::get<0>(rows.abs().max(1));
  // As bitsandbytes: multiply by the reciprocal, clamp to [-1, 1], nearest code by the
  // midpoints between neighbouring codes (a value on a midpoint takes the lower code).
  const at::Tensor scaled = at::clamp(rows * (1.0 / amax.clamp_min(1e-38)).view({-1, 1}), -1, 1);
  const at::Tensor bounds = (map.slice(0, 0, 255) + map.slice(0, 1, 256)) / 2;
  const at::Tensor q = at::bucketize(scaled.reshape({-1}), bounds, /*out_int32=*/true);
  codes.copy_(q.slice(0, 0, n).to(at::kByte).view(codes.sizes()));
  absmax.copy_(amax);
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax,
                                const at::Tensor& map) {
  const int64_t n = codes.numel();
  const int64_t blocks = quant_blocks(n);
  at::Tensor values = map.index({codes.reshape({-1}).to(at::kLong)});
  if (blocks * kQuantBlock != n) {
    values = at::cat({values, at::zeros({blocks * kQuantBlock - n}, values.options())});
  }
  values = (values.view({blocks, kQuantBlock}) * absmax.view({-1, 1})).reshape({-1});
  return values.slice(0, 0, n).view(codes.sizes());
}

}  // namespace moe::quant
