// ZeRO stages 1 and 2 (DeepSpeed's zero_optimization.stage) over the data-parallel group, with
// whole parameters as the unit of ownership: each rank owns a share of the parameters balanced
// by size and keeps Adam state only for those (stage 1), and from stage 2 keeps only their
// gradients: reduced onto the owners during the backward (reduce_in_backward), or released after
// an all-reduce when the overlap is off. After each update the owners broadcast their
// parameters. Checkpoints keep the single-process layout: when one is written the owners' states
// are gathered to rank 0, and any world size can load it (each rank keeps its own share).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/optim/adamw.h"

namespace moe::parallel {

class ProcessGroup;
// Optimizer and checkpoint types still live in moe::train (docs/architecture.md).
using checkpoint::OptimizerStream;
using optim::FusedAdamW;

class ZeroPartition {
 public:
  // `names`/`params`: every parameter, in model order (the same on every rank).
  // reduce_bytes: gradient bytes per reduce (stage 2 in the backward); broadcast_bytes: parameter
  // bytes per broadcast of updated shares. `subgroup`: the ranks that share these parameters
  // out (a group of `group`; expert parallelism partitions the experts over their replicas).
  ZeroPartition(parallel::ProcessGroup& group, int64_t stage, std::vector<std::string> names,
                std::vector<torch::Tensor> params, int64_t reduce_bytes, int64_t broadcast_bytes,
                int64_t subgroup = 0);
  int64_t stage() const { return stage_; }
  bool owns(const std::string& name) const;
  bool holds(const std::string& name) const;  // whether `name` is one of this partition's
  int64_t owned_elements() const;

  // Stage 2: gradients of parameters this rank does not own are released.
  void drop_foreign_gradients();

  // Stage 2 overlapped with the backward (DeepSpeed's reduce during backward): from now on every
  // backward sums each gradient onto its owner while the backward goes on, in buckets of
  // parameters in reverse model order (about the order gradients become ready), launched in
  // bucket order so every rank issues the same collectives; a bucket's parameters of one owner
  // go in one reduce. A rank releases a foreign gradient as soon as its bucket is launched, so
  // it never holds more than its own gradients and two buckets in flight. Every micro-step's
  // backward reduces (owners accumulate the sums); finish_backward() after each backward,
  // average_owned() after the last.
  void reduce_in_backward();
  bool reduces_in_backward() const { return !buckets_.empty(); }
  void finish_backward();
  void average_owned();  // the owned gradients: from the sum over ranks to the mean
  // The global L2 norm of all gradients when each rank holds only its own (stage 2); clips them
  // like clip_grad_norm. Returns the norm.
  torch::Tensor clip_global(const std::vector<torch::Tensor>& own_grads, double max_norm);
  // After the owners' optimizer step: every rank gets every updated parameter.
  void broadcast_updates();
  // For a checkpoint: every owner's Adam state in the single-process layout, one tensor at a
  // time (each broadcast from its owner when the writer asks for it), so no rank ever holds
  // more than its share plus one state tensor. Every rank must drain it (call each()), in the
  // same order: rank 0 writing, the others with a sink that drops the tensors.
  OptimizerStream optimizer_stream(FusedAdamW& mine);

 private:
  int64_t rank() const;  // in the subgroup
  int64_t size() const;
  parallel::ProcessGroup& group_;
  int64_t gid_;
  int64_t stage_, reduce_bytes_, broadcast_bytes_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> owner_;  // per parameter

  // reduce_in_backward()'s state.
  struct Launched {
    int64_t owner;
    std::vector<size_t> params;
    torch::Tensor flat;
    std::function<void()> wait;
  };
  void grad_ready(size_t param);
  void launch(size_t bucket);
  void complete(Launched& l);
  void rearm();  // the next backward: no bucket launched, every gradient awaited
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> waiting_;  // per bucket: gradients not yet accumulated in this backward
  size_t next_bucket_ = 0;
  std::vector<std::vector<Launched>> in_flight_;  // launched buckets, oldest first
};

}  // namespace moe::parallel
