#include "moe/quant/fp8_blockwise.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace moe::quant {

std::vector<int64_t> fp8_scale_shape(at::IntArrayRef weight_shape, const Fp8Block& block) {
  if (!block) return {};
  TORCH_CHECK(weight_shape.size() >= 2, "fp8: a blockwise weight has rows and columns, got ",
              weight_shape);
  std::vector<int64_t> s(weight_shape.begin(), weight_shape.end());
  const size_t r = s.size() - 2, c = s.size() - 1;
  s[r] = (s[r] + block->first - 1) / block->first;
  s[c] = (s[c] + block->second - 1) / block->second;
  return s;
}

bool fp8_per_slice_scales(at::IntArrayRef weight_shape, at::IntArrayRef scale_shape) {
  const size_t n = weight_shape.size();
  if (n < 2 || scale_shape.size() != n) return false;
  for (size_t i = 0; i + 2 < n; ++i) {
    if (scale_shape[i] != weight_shape[i]) return false;
  }
  const int64_t sr = scale_shape[n - 2], sc = scale_shape[n - 1];
  return sr > 0 && sc > 0 && weight_shape[n - 2] % sr == 0 && weight_shape[n - 1] % sc == 0;
}

at::Tensor dequantize_fp8_blockwise(const at::Tensor& weight, const at::Tensor& scale_inv,
                                    const Fp8Block& block, at::ScalarType dtype) {
  TORCH_CHECK(
      weight.scalar_type() == at::kFloat8_e4m3fn || weight.scalar_type() == at::kFloat8_e5m2,
      "fp8: the weight must be float8_e4m3fn or float8_e5m2");
  const auto want = fp8_scale_shape(weight.sizes(), block);
  const bool per_slice =
      !block && scale_inv.numel() != 1 && fp8_per_slice_scales(weight.sizes(), scale_inv.sizes());
  TORCH_CHECK(block ? scale_inv.sizes().vec() == want : scale_inv.numel() == 1 || per_slice,
              "fp8: scales ", scale_inv.sizes(), " for a weight ", weight.sizes());
  // As transformers: both cast to the output dtype first, then one multiply in it (its
  // Fp8Dequantize multiplies in fp32, then casts: the same values for the fp32 the import asks).
  const at::Tensor scale = scale_inv.to(dtype);
  at::Tensor w = weight.to(dtype);
  if (per_slice) {  // [..., sr, rows / sr, sc, cols / sc] times [..., sr, 1, sc, 1]
    const int64_t sr = scale.size(-2), sc = scale.size(-1);
    w.unflatten(-1, {sc, w.size(-1) / sc})
        .unflatten(-3, {sr, w.size(-2) / sr})
        .mul_(scale.unsqueeze(-1).unsqueeze(-3));
    return w;
  }
  if (!block) return w.mul_(scale.reshape({}));
  const int64_t rows = w.size(-2), cols = w.size(-1);
  const int64_t full = cols / block->second, rem = cols % block->second;
  // Scales repeated over their rows only; broadcast over the columns through a view of w.
  const at::Tensor per_row = scale.repeat_interleave(block->first, -2).narrow(-2, 0, rows);
  if (full > 0) {
    w.narrow(-1, 0, full * block->second)
        .unflatten(-1, {full, block->second})
        .mul_(per_row.narrow(-1, 0, full).unsqueeze(-1));
  }
  if (rem > 0) w.narrow(-1, full * block->second, rem).mul_(per_row.narrow(-1, full, 1));
  return w;
}

}  // namespace moe::quant
