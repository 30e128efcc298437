#include "moe/model/cached_conv1d.h"

#include <torch/torch.h>

#include "moe/model/gated_delta_rule.h"

namespace moe::model {

torch::Tensor cached_causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                        const torch::Tensor& bias, LayerCache& cache) {
  const int64_t S = x.size(1), K = weight.size(2);
  const auto before =
      cache.conv.defined() ? cache.conv : torch::zeros({x.size(0), K - 1, x.size(2)}, x.options());
  const auto joined = torch::cat({before, x}, 1);
  cache.conv = joined.narrow(1, joined.size(1) - (K - 1), K - 1);
  return causal_conv1d_silu(joined, weight, {}, bias).narrow(1, K - 1, S);
}

}  // namespace moe::model
