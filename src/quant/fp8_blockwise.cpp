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

at::Tensor dequantize_fp8_blockwise(const at::Tensor& weight, const at::Tensor& scale_inv,
                                    const Fp8Block& block, at::ScalarType dtype) {
  TORCH_CHECK(
      weight.scalar_type() == at::kFloat8_e4m3fn || weight.scalar_type() == at::kFloat8_e5m2,
      "fp8: the weight must be float8_e4m3fn or float8_e5m2");
  const auto want = fp8_scale_shape(weight.sizes(), block);
  TORCH_CHECK(block ? scale_inv.sizes().vec() == want : scale_inv.numel() == 1, "fp8: scales ",
              scale_inv.sizes(), " for a weight ", weight.sizes());
  // As transformers: both cast to the output dtype first, then one multiply in it.
  const at::Tensor scale = scale_inv.to(dtype);
  at::Tensor w = weight.to(dtype);
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
