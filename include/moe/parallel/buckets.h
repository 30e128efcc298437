// Buckets for the data-parallel collectives (gradient all-reduce after the backward, ZeRO-2's
// reduce in the backward, ZeRO's parameter broadcasts): consecutive tensors packed into flat
// buffers of a bounded size, and copied back out.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace moe::parallel {

// Indices 0..n-1 of `bytes` cut into consecutive runs of at most `cap` bytes; an item larger
// than `cap` is a bucket of its own.
inline std::vector<std::vector<size_t>> pack_buckets(const std::vector<int64_t>& bytes,
                                                     int64_t cap) {
  std::vector<std::vector<size_t>> buckets;
  int64_t used = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (buckets.empty() || (used + bytes[i] > cap && !buckets.back().empty())) {
      buckets.emplace_back();
      used = 0;
    }
    buckets.back().push_back(i);
    used += bytes[i];
  }
  return buckets;
}

// Copies consecutive slices of `flat` into `tensors` (the inverse of cat of their flat views).
inline void copy_from_flat(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

}  // namespace moe::parallel
