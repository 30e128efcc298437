#include "moe/optim/gradient_clipping.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace moe::optim {

namespace {
constexpr double kNormEps = 1e-6;  // clip_grad_norm_'s: max_norm / (norm + 1e-6)
}  // namespace

torch::Tensor gradient_norm(const std::vector<torch::Tensor>& grads) {
  // 16-bit gradients' norms are taken in fp32 (fp32 ones exactly as before: no dtype argument).
  const bool all_fp32 = std::all_of(grads.begin(), grads.end(), [](const torch::Tensor& g) {
    return g.scalar_type() == torch::kFloat;
  });
  return at::linalg_vector_norm(
      at::stack(all_fp32 ? at::_foreach_norm(grads, 2) : at::_foreach_norm(grads, 2, at::kFloat)),
      2);
}

torch::Tensor clip_divisor(const torch::Tensor& norm, double max_norm) {
  if (!std::isfinite(max_norm)) return {};  // no clipping: no grad_scale (no write-back pass)
  const auto divisor = ((norm + kNormEps) / max_norm).clamp_min(1.0);
  return at::where(norm.isfinite(), divisor, at::ones_like(divisor));
}

void scale_by_clip_coefficient(const std::vector<torch::Tensor>& grads, const torch::Tensor& norm,
                               double max_norm) {
  if (!std::isfinite(max_norm) || grads.empty()) return;
  const auto n = norm.to(grads.front().device());
  auto coef = (max_norm / (n + kNormEps)).clamp_max(1.0);
  coef = at::where(n.isfinite(), coef, at::ones_like(coef));
  at::_foreach_mul_(grads, coef);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& grads, double max_norm) {
  auto norm = gradient_norm(grads);
  scale_by_clip_coefficient(grads, norm, max_norm);
  return norm;
}

}  // namespace moe::optim
