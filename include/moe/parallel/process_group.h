// The data-parallel process group: LibTorch's c10d (a TCPStore rendezvous at MASTER_ADDR:
// MASTER_PORT, Gloo on CPUs, NCCL on GPUs) and the few collectives the trainer needs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/choices.h"
#include "moe/parallel/launch_env.h"

namespace moe::parallel {

class ProcessGroup {
 public:
  // backend: gloo or nccl (not auto: the caller resolves it). Every collective and the
  // rendezvous give up after `timeout`.
  ProcessGroup(const LaunchEnv& env, config::DistBackend backend,
               std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return env_.rank; }
  int64_t size() const { return env_.world_size; }
  config::DistBackend backend() const { return backend_; }

  // Subgroups (expert parallelism's EP and expert-data-parallel groups): `ranks` (ascending,
  // holding this rank) become a group of their own, a c10d backend over the same store; returns
  // its id for the collectives below (kWorld: every rank). Every member calls it with the same
  // list; a group of one needs no backend (its collectives are the identity).
  static constexpr int64_t kWorld = 0;
  int64_t new_group(const std::vector<int64_t>& ranks);
  int64_t group_size(int64_t group) const;
  int64_t group_rank(int64_t group) const;  // this rank's place in `group`

  // In place: the mean over ranks of each tensor, all-reduced in flat buckets of at most
  // `bucket_bytes` (tensors of one dtype and device).
  void allreduce_mean(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes);
  // In place: each tensor's sum over the ranks of `group`, times `scale`, in flat buckets.
  void allreduce_scaled(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes,
                        double scale, int64_t group);
  void allreduce_sum(torch::Tensor& t, int64_t group = kWorld);  // in place
  // Every rank's `t` (same shape everywhere) concatenated along dim 0 in rank order.
  torch::Tensor all_gather_rows(const torch::Tensor& t, int64_t group = kWorld);
  // Starts an in-place sum of `t` over the ranks onto rank `root` and returns its wait: call it
  // before reading `t` on the root (the sum is then there); `t` must stay alive until then.
  // `root` and the ranks are `group`'s.
  std::function<void()> reduce_sum_async(const torch::Tensor& t, int64_t root,
                                         int64_t group = kWorld);
  void broadcast(torch::Tensor& t, int64_t root,
                 int64_t group = kWorld);  // in place: root's values everywhere
  // Rows of `rows` (dim 0), send[j] of them to rank j in order; returns the rows received,
  // recv[i] from rank i, in rank order (c10d alltoall_base): expert parallelism's exchange.
  torch::Tensor all_to_all(const torch::Tensor& rows, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, int64_t group = kWorld);
  // Every rank's `mine`, in rank order (through the rendezvous store).
  std::vector<std::string> allgather_text(const std::string& key, const std::string& mine);
  void barrier();
  // The step this rank is in (1-based), published with its heartbeat: a failed collective names
  // the ranks that are dead, hung or behind (missing_ranks).
  void set_step(int64_t step);
  // Runs `f` (e.g. a backward whose all-reduce runs inside it): a collective failing in it ends
  // this rank with the same TrainingError as the collectives above.
  void guard(const char* what, const std::function<void()>& f);

  // Gradient averaging overlapped with the backward: c10d's DDP Reducer on `params` (every one
  // must receive a gradient in every backward), buckets of `bucket_bytes` filled in the order
  // gradients become ready and all-reduced while the backward goes on. Call
  // prepare_gradient_sync(loss) before the backward whose gradients (accumulated since the last
  // sync) are to be averaged; backwards without it accumulate locally (accumulation
  // micro-steps). Once per process group.
  void enable_gradient_sync(const std::vector<torch::Tensor>& params, int64_t bucket_bytes);
  bool gradient_sync_enabled() const;
  void prepare_gradient_sync(const torch::Tensor& loss);

 private:
  torch::Tensor on_backend_device(const torch::Tensor& t) const;
  template <class F>
  void collective(const char* what, F&& f) const;
  std::string missing_ranks() const;
  struct Impl;
  LaunchEnv env_;
  config::DistBackend backend_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::parallel
