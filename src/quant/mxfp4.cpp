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

}  // namespace moe::quant
