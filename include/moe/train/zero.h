// ZeRO stages 1 and 2 (DeepSpeed's zero_optimization.stage) over the data-parallel group, with
// whole parameters as the unit of ownership: each rank owns a share of the parameters balanced
// by size and keeps Adam state only for those (stage 1), and from stage 2 keeps only their
// gradients once the step's reduction is done. After each update the owners broadcast their
// parameters. Checkpoints keep the single-process layout: when one is written the owners' states
// are gathered to rank 0, and any world size can load it (each rank keeps its own share).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/train/adamw.h"

namespace moe::dist {
class ProcessGroup;
}

namespace moe::train {

class ZeroPartition {
 public:
  // `names`/`params`: every parameter, in model order (the same on every rank).
  ZeroPartition(dist::ProcessGroup& group, int64_t stage, std::vector<std::string> names,
                std::vector<torch::Tensor> params, int64_t bucket_bytes);
  int64_t stage() const { return stage_; }
  bool owns(const std::string& name) const;
  int64_t owned_elements() const;

  // Stage 2: gradients of parameters this rank does not own are released.
  void drop_foreign_gradients();
  // The global L2 norm of all gradients when each rank holds only its own (stage 2); clips them
  // like clip_grad_norm. Returns the norm.
  torch::Tensor clip_global(const std::vector<torch::Tensor>& own_grads, double max_norm);
  // After the owners' optimizer step: every rank gets every updated parameter.
  void broadcast_updates();
  // For a checkpoint: on rank 0 a FusedAdamW over `all_groups` holding every owner's state (the
  // single-process layout), null elsewhere. Every rank must call it.
  std::unique_ptr<FusedAdamW> gather_optimizer(FusedAdamW& mine, std::vector<AdamWGroup> all_groups,
                                               double beta1, double beta2, double eps);

 private:
  dist::ProcessGroup& group_;
  int64_t stage_, bucket_bytes_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> owner_;  // per parameter
};

}  // namespace moe::train
