#include "moe/moe/expert_parallel.h"

#include <torch/torch.h>

#include <numeric>

namespace moe::moe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows,
                               std::vector<int64_t> send, std::vector<int64_t> recv,
                               const AllToAll* exchange) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    // The exchange lives in the layer's options, which outlive the step's graph.
    ctx->saved_data["exchange"] = reinterpret_cast<int64_t>(exchange);
    return (*exchange)(rows, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* exchange = reinterpret_cast<const AllToAll*>(ctx->saved_data["exchange"].toInt());
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    return {(*exchange)(grad[0].contiguous(), recv, send), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor exchange_rows(const torch::Tensor& rows, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, const AllToAll& exchange) {
  return ExchangeRows::apply(rows, send, recv, &exchange);
}

torch::Tensor experts_across_ranks(
    const torch::Tensor& rows, const torch::Tensor& counts, const ExpertParallel& ep,
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& local) {
  const int64_t P = ep.size, E = counts.size(0), L = E / P;
  // Counts first: each rank learns how many rows of each of its experts every rank sends.
  const auto mine = counts.to(torch::kCPU, torch::kLong).contiguous();
  const auto theirs =
      ep.all_to_all(mine, std::vector<int64_t>(P, L), std::vector<int64_t>(P, L)).contiguous();
  const int64_t* out_n = mine.data_ptr<int64_t>();   // [P, L]: to rank j, its expert e
  const int64_t* in_n = theirs.data_ptr<int64_t>();  // [P, L]: from rank i, my expert e
  std::vector<int64_t> send(P, 0), recv(P, 0);
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t e = 0; e < L; ++e) send[j] += out_n[j * L + e], recv[j] += in_n[j * L + e];
  }
  const auto received = exchange_rows(rows, send, recv, ep.all_to_all);
  // Received rows come by source rank, then expert; the experts want them by expert, then
  // source. `order[k]`: the received row that goes k-th.
  std::vector<int64_t> start(P * L), order, per_expert(L, 0);
  int64_t at = 0;
  for (int64_t i = 0; i < P; ++i) {
    for (int64_t e = 0; e < L; ++e) start[i * L + e] = at, at += in_n[i * L + e];
  }
  order.reserve(static_cast<size_t>(at));
  for (int64_t e = 0; e < L; ++e) {
    for (int64_t i = 0; i < P; ++i) {
      for (int64_t k = 0; k < in_n[i * L + e]; ++k) order.push_back(start[i * L + e] + k);
      per_expert[e] += in_n[i * L + e];
    }
  }
  std::vector<int64_t> inverse(order.size());
  for (size_t k = 0; k < order.size(); ++k)
    inverse[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
  const auto on = torch::TensorOptions().dtype(torch::kLong).device(rows.device());
  const auto by_expert = received.index_select(0, torch::tensor(order, on));
  const auto done = local(by_expert, torch::tensor(per_expert, torch::kLong));
  // Back to source order, and back to the ranks the rows came from.
  return exchange_rows(done.index_select(0, torch::tensor(inverse, on)), recv, send, ep.all_to_all);
}

}  // namespace moe::moe
