#include "moe/model/decode_cache.h"

#include <algorithm>

#include <torch/torch.h>

namespace moe::model {

AttendedKeys attend_cached(LayerCache& cache, const DecodeStep& step, const torch::Tensor& k,
                           const torch::Tensor& v, int64_t window) {
  const int64_t S = k.size(2);
  AttendedKeys out;
  if (cache.k.defined()) {
    out.k = torch::cat({cache.k, k}, 2);
    out.v = torch::cat({cache.v, v}, 2);
  } else {
    out.k = k, out.v = v;
    cache.first_slot = step.past;
  }
  const int64_t T = out.k.size(2), first = cache.first_slot;
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(k.device());
  const auto key_slot = torch::arange(first, first + T, longs);            // [T]
  const auto query_slot = torch::arange(step.past, step.past + S, longs);  // [S]
  const auto distance = query_slot.unsqueeze(1) - key_slot.unsqueeze(0);   // [S, T]
  auto allowed = distance.ge(0);
  if (window > 0) allowed = allowed & distance.lt(window);
  const auto real = step.valid.narrow(1, first, T).to(k.device());  // [B, T]
  out.mask = (allowed.unsqueeze(0) & real.unsqueeze(1)) | distance.eq(0).unsqueeze(0);
  out.mask = out.mask.unsqueeze(1);  // [B, 1, S, T]
  // The next step's query (slot past + S) sees the last window - 1 slots of these.
  const int64_t keep = window > 0 ? std::min(T, window - 1) : T;
  cache.k = out.k.narrow(2, T - keep, keep);
  cache.v = out.v.narrow(2, T - keep, keep);
  cache.first_slot = first + T - keep;
  return out;
}

}  // namespace moe::model
