// The process layout, decided in one place (torchtitan's ParallelDims): the world, this process's
// rank, the expert-parallel split, and from those every rank set and expert range that the
// data-parallel boundary, the MoE layer and the model ask for. The launcher's variables are read
// once, by parallel/launch_env.h; moe.expert_parallel_size comes from the config. No LibTorch.
#pragma once

#include <cstdint>
#include <vector>

namespace moe::config {

// Experts [first, first + count) of `total`.
struct ExpertRange {
  int64_t first = 0, count = 0, total = 0;
  bool all() const { return count == total; }
};

// The experts held by place `ep_rank` of an expert-parallel group of `ep_size` ranks: an equal,
// contiguous share, in rank order. std::invalid_argument when `total` is not a multiple of
// `ep_size` or the rank is outside the group (config validation refuses such configs first).
ExpertRange expert_range(int64_t total, int64_t ep_size, int64_t ep_rank);

struct ParallelDims {
  int64_t world = 1;  // processes in the job
  int64_t rank = 0;   // this process, 0..world-1
  int64_t ep = 1;     // expert-parallel group size (moe.expert_parallel_size in effect)

  // Ranks [k * ep, (k + 1) * ep) form an EP group: between them they hold every expert.
  int64_t ep_rank() const { return rank % ep; }
  std::vector<int64_t> ep_group() const;
  // The ranks holding the same experts as this one (equal mod ep): the experts' data-parallel
  // replicas, over which their gradients are averaged and ZeRO shares their state.
  std::vector<int64_t> expert_replicas() const;
  ExpertRange experts(int64_t total) const { return expert_range(total, ep, ep_rank()); }
};

// Checks the layout (world >= 1, 0 <= rank < world, ep >= 1 dividing world) and returns it;
// std::invalid_argument naming the numbers otherwise.
ParallelDims parallel_dims(int64_t world, int64_t rank, int64_t ep);

}  // namespace moe::config
