// MXFP4 (quant/mxfp4.h): the quantizer's scale rule, rounding (ties to the even code) and
// saturation, written out by hand for one block; round trips of representable values; and the
// dequantizer's code table and nibble order.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/quant/mxfp4.h"

namespace moe::quant {
namespace {

torch::Tensor round_trip(const torch::Tensor& x) {
  auto [blocks, scales] = quantize_mxfp4(x);
  return dequantize_mxfp4(blocks, scales, torch::kFloat);
}

TEST(Mxfp4, OneBlockByHand) {
  // amax 6: shared exponent floor(log2 6) - 2 = 0, so the values are rounded as they are.
  std::vector<float> v = {6.0f,  0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f,  5.0f,
                          -0.2f, -0.3f, 0.7f,  2.9f,  -4.6f, 0.0f, -6.0f, 1.0f};
  v.resize(32, 0.0f);
  const auto x = torch::tensor(v);
  auto [blocks, scales] = quantize_mxfp4(x);
  EXPECT_EQ(scales.item<uint8_t>(), 127);
  // Ties to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  const std::vector<float> want = {6.0f,  0.0f,  1.0f, 1.0f, 2.0f,  2.0f, 4.0f,  4.0f,
                                   -0.0f, -0.5f, 0.5f, 3.0f, -4.0f, 0.0f, -6.0f, 1.0f};
  const auto got = dequantize_mxfp4(blocks, scales, torch::kFloat);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[static_cast<int64_t>(i)].item<float>(), want[i]) << "value " << i << " " << v[i];
  }
  // Nibble order: the first value of a pair in the low nibble (6.0 is code 7, 0 is code 0).
  EXPECT_EQ(blocks.flatten()[0].item<uint8_t>(), 0x07);
  // Past 6 times the scale (up to 8: the scale follows the block's largest power of two) a value
  // saturates at 6.
  auto big = torch::zeros({32});
  big[0] = 7.9f;
  EXPECT_EQ(round_trip(big)[0].item<float>(), 6.0f);
}

TEST(Mxfp4, RepresentableValuesRoundTripExactly) {
  torch::manual_seed(1);
  const auto table = torch::tensor({0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f});
  auto codes = torch::randint(0, 8, {64, 32});
  codes.select(1, 0).fill_(7);  // each block holds a 6: its scale is the block's own
  auto x = table.index({codes}) * torch::where(torch::rand({64, 32}) < 0.5, -1.0f, 1.0f);
  x = x * torch::pow(2.0f, torch::randint(-20, 20, {64, 1}).to(torch::kFloat));
  EXPECT_TRUE(torch::equal(round_trip(x), x));
}

TEST(Mxfp4, ErrorWithinOneStepOfTheBlock) {
  torch::manual_seed(2);
  const auto x = torch::randn({128, 64}) * 0.02;
  const auto y = round_trip(x);
  // Per block the coarsest step is 2 x 2^(floor(log2 amax) - 2) (from 4 to 6): values below 6
  // times the scale are within half of it, the saturated ones above within one.
  const auto amax = x.reshape({-1, 32}).abs().amax(1, true);
  const auto step = torch::pow(2.0, torch::floor(torch::log2(amax)) - 2) * 2;
  EXPECT_TRUE(((y - x).reshape({-1, 32}).abs() <= step).all().item<bool>());
  EXPECT_EQ(round_trip(torch::zeros({32})).abs().sum().item<float>(), 0.0f);
  auto [b, s] = quantize_mxfp4(torch::full({32}, 1.5f * std::pow(2.0f, 100.0f)));
  EXPECT_EQ(s.item<uint8_t>(), 127 + 100 - 2) << "e8m0 = 127 + floor(log2 amax) - 2";
  EXPECT_THROW(quantize_mxfp4(torch::zeros({31})), c10::Error);
}

}  // namespace
}  // namespace moe::quant
