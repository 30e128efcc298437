#include "moe/quant/mxfp4.h"

#include <torch/torch.h>

namespace moe::quant {

torch::Tensor dequantize_mxfp4(const torch::Tensor& blocks, const torch::Tensor& scales,
                               torch::ScalarType dtype) {
  TORCH_CHECK(blocks.scalar_type() == torch::kUInt8 && scales.scalar_type() == torch::kUInt8,
              "mxfp4: blocks and scales must be uint8");
  TORCH_CHECK(blocks.dim() >= 1 && blocks.size(-1) == kMxfp4BlockBytes &&
                  blocks.sizes().slice(0, blocks.dim() - 1) == scales.sizes(),
              "mxfp4: blocks ", blocks.sizes(), " and scales ", scales.sizes(), " do not match");
  // e2m1: sign, two exponent bits, one mantissa bit (transformers' FP4_VALUES).
  static const float kValues[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const auto lut = torch::from_blob(const_cast<float*>(kValues), {16}).to(dtype);
  auto out_sizes = scales.sizes().vec();
  const int64_t G = out_sizes.empty() ? 1 : out_sizes.back();
  const auto flat = blocks.reshape({-1, kMxfp4BlockBytes});
  auto out = torch::empty({flat.size(0), 2 * kMxfp4BlockBytes}, lut.options());
  out.slice(1, 0, std::nullopt, 2).copy_(lut.index({flat.bitwise_and(0x0F).to(torch::kLong)}));
  out.slice(1, 1, std::nullopt, 2).copy_(lut.index({flat.bitwise_right_shift(4).to(torch::kLong)}));
  const auto exponent = scales.reshape({-1, 1}).to(torch::kInt) - 127;
  out = torch::ldexp(out, exponent).to(dtype);
  if (out_sizes.empty()) return out.reshape({2 * kMxfp4BlockBytes});
  out_sizes.back() = G * 2 * kMxfp4BlockBytes;
  return out.reshape(out_sizes);
}

std::pair<torch::Tensor, torch::Tensor> quantize_mxfp4(const torch::Tensor& m) {
  TORCH_CHECK(m.dim() >= 1 && m.size(-1) % 32 == 0, "mxfp4: the last dimension ", m.sizes(),
              " is not a multiple of 32");
  auto sizes = m.sizes().vec();
  const int64_t groups = sizes.back() / 32;
  const auto x = m.to(torch::kFloat).reshape({-1, 32});
  const auto amax = x.abs().amax(1, /*keepdim=*/true);
  // frexp: amax = f * 2^e with f in [0.5, 1), so floor(log2(amax)) = e - 1, exactly.
  const auto exponent = std::get<1>(torch::frexp(amax)).to(torch::kInt) - 1 - 2;
  auto shared =
      torch::where(amax.gt(0), exponent, torch::full_like(exponent, -127)).clamp(-127, 127);
  const auto y = torch::ldexp(x, -shared);  // exact: a power of two
  static const float kBounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const auto bounds = torch::from_blob(const_cast<float*>(kBounds), {7}).clone();
  const auto mag = y.abs();
  auto idx = torch::bucketize(mag, bounds);  // bounds[i-1] < mag <= bounds[i] -> i
  // A tie sits exactly on a bound and bucketize gave the lower code: the even one wins.
  const auto tie = mag.eq(bounds.index({idx.clamp_max(6)})) & idx.lt(7);
  idx = torch::where(tie & idx.remainder(2).eq(1), idx + 1, idx);
  const auto code = (idx + torch::where(y.lt(0), 8, 0)).to(torch::kUInt8);  // -0 keeps its sign
  const auto pairs = code.reshape({-1, 16, 2});
  const auto blocks = pairs.select(2, 0).bitwise_or(pairs.select(2, 1).bitwise_left_shift(4));
  auto block_sizes = sizes;
  block_sizes.back() = groups;
  const auto scales = (shared + 127).to(torch::kUInt8).reshape(block_sizes);
  block_sizes.push_back(16);
  return {blocks.reshape(block_sizes).contiguous(), scales.contiguous()};
}

}  // namespace moe::quant
