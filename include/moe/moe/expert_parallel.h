// Expert parallelism as the MoE layer sees it (issue 28): the experts are spread over the ranks
// of an EP group, each holding an equal contiguous share (config/parallel_dims.h says which); after
// the local permute, the rows travel to the rank of their expert and back through an all-to-all.
// The exchange is a function here (the EP group's c10d alltoall_base in training,
// parallel::ProcessGroup::all_to_all), so the layer needs no process group of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/types.h>

namespace moe::moe {

// Rows of `rows` (dim 0) sent to each rank of the group, `send[j]` to rank j in order, and the
// rows received from each, `recv[i]` from rank i, concatenated in rank order.
using AllToAll = std::function<torch::Tensor(
    const torch::Tensor& rows, const std::vector<int64_t>& send, const std::vector<int64_t>& recv)>;

struct ExpertParallel {
  int64_t size = 1;     // ranks the experts are spread over; 1: every expert here
  int64_t rank = 0;     // this rank's place in its EP group
  AllToAll all_to_all;  // the group's exchange; unused when size is 1
};

// all_to_all with a backward: the gradients of the received rows go back the way they came
// (the same exchange with send and recv swapped). `exchange` must outlive the autograd graph.
torch::Tensor exchange_rows(const torch::Tensor& rows, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, const AllToAll& exchange);

// The experts' computation across the group: `rows` [N, d] in expert order with `counts` [E]
// (E experts in all) from this rank's permute -> this rank's rows after every rank's experts ran
// on them, in the same order. `local` runs this rank's E / size experts on rows in their order
// with per-expert counts.
torch::Tensor experts_across_ranks(
    const torch::Tensor& rows, const torch::Tensor& counts, const ExpertParallel& ep,
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& local);

}  // namespace moe::moe
