#include "moe/config/parallel_dims.h"

#include <stdexcept>
#include <string>

namespace moe::config {

ExpertRange expert_range(int64_t total, int64_t ep_size, int64_t ep_rank) {
  if (ep_size < 1 || total % ep_size != 0 || ep_rank < 0 || ep_rank >= ep_size) {
    throw std::invalid_argument("expert range: " + std::to_string(total) + " experts over " +
                                std::to_string(ep_size) + " ranks, place " +
                                std::to_string(ep_rank) +
                                " (expected the experts a multiple of the group size)");
  }
  const int64_t count = total / ep_size;
  return {ep_rank * count, count, total};
}

std::vector<int64_t> ParallelDims::ep_group() const {
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < ep; ++i) ranks.push_back(rank / ep * ep + i);
  return ranks;
}

std::vector<int64_t> ParallelDims::expert_replicas() const {
  std::vector<int64_t> ranks;
  for (int64_t j = rank % ep; j < world; j += ep) ranks.push_back(j);
  return ranks;
}

ParallelDims parallel_dims(int64_t world, int64_t rank, int64_t ep) {
  if (world < 1 || rank < 0 || rank >= world || ep < 1 || world % ep != 0) {
    throw std::invalid_argument("parallel layout: world " + std::to_string(world) + ", rank " +
                                std::to_string(rank) + ", expert-parallel size " +
                                std::to_string(ep) +
                                " (expected 0 <= rank < world and world a multiple of it)");
  }
  return {world, rank, ep};
}

}  // namespace moe::config
