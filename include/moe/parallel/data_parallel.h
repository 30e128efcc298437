// The one data-parallel boundary: everything a step and a run do differently because other
// ranks train the same model (docs/distributed.md), behind one interface chosen once from the
// world size, ZeRO stage and overlap_comm (config::data_parallel_mode):
//   LocalTraining       a world of one: every call is a no-op or the plain local computation;
//   RankGroup           world > 1, with one of the gradient reductions of config::GradientReduction
//                       (c10d's DDP Reducer in the backward, a bucketed all-reduce after it, or
//                       ZeRO-2's reduce onto owners in the backward) and ZeRO-1/2 ownership.
// The trainer and the step runner call it without asking which one it is, as Marian's GraphGroup
// and torchtitan's parallel dims keep parallelism out of the training loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/checkpoint/checkpoint_files.h"
#include "moe/config/config.h"
#include "moe/model/transformer.h"
#include "moe/moe/moe_math.h"
#include "moe/optim/adamw.h"
#include "moe/parallel/launch_env.h"

namespace spdlog {
class logger;
}

namespace moe::parallel {

class ProcessGroup;
// Optimizer and checkpoint types still live in moe::train (docs/architecture.md).
using checkpoint::OptimizerStream;
using optim::FusedAdamW;

struct StepResult;

// DataParallel::clip's answer.
struct Clipping {
  double norm = 0.0;           // the global L2 norm before clipping
  torch::Tensor grad_divisor;  // for the optimizer's grad_scale; undefined: already applied
};

// The inputs of the save and stop decisions, the same on every rank once agreed: rank 0's
// clocks, and a signal or checkpoint request that reached any rank.
struct StopInputs {
  double minutes_since_save = 0, run_minutes = 0;
  int signal = 0;
  bool checkpoint_request = false;
};

class DataParallel {
 public:
  // A world of one (LocalTraining) or, under torchrun/Slurm, a process group whose ranks have
  // checked that they all resolved the same config (else exit 2 on every rank, naming the first
  // differing key). Ranks other than 0 log warnings and errors only.
  static std::unique_ptr<DataParallel> create(const config::Config& cfg,
                                              const parallel::LaunchEnv& launch, bool cuda,
                                              spdlog::logger& log);
  // The ranks of `group` running `mode` (create() takes config::data_parallel_mode; tests force
  // a mode on a group of one, where every mode must be the identity).
  static std::unique_ptr<DataParallel> over(const config::Config& cfg,
                                            std::unique_ptr<parallel::ProcessGroup> group,
                                            const config::DataParallelMode& mode);
  virtual ~DataParallel() = default;

  virtual int64_t rank() const { return 0; }
  virtual int64_t size() const { return 1; }
  bool writes() const { return rank() == 0; }  // checkpoints, metrics and sinks: rank 0 only
  // How the routers combine their expert counts over the ranks (moe_math.h) and the experts'
  // EP group (expert_parallel.h); empty alone.
  virtual moe::MoeParallel moe_parallel() { return {}; }

  // The model exists: ZeRO decides which ranks own which parameters.
  virtual void attach(model::TransformerLM& model) {}
  // Whether this rank's optimizer updates parameter `name` (ZeRO: its owner only).
  virtual bool updates(const std::string& name) const { return true; }
  // The optimizer holds a share of the parameters: a checkpoint's other states are skipped.
  virtual bool optimizer_is_share() const { return false; }
  // After the resume: every rank continues from the same step of the same checkpoint, or all
  // exit 2 naming each rank's (node-local output directories).
  virtual void agree_on_resume(int64_t step, const std::string& checkpoint,
                               const std::string& store_root) {}
  // Before the first step: the gradient reduction that runs inside the backward is armed.
  virtual void start(model::TransformerLM& model) {}
  virtual void set_step(int64_t step) {}  // published with the heartbeat (a hung rank is named)
  virtual StopInputs agree(const StopInputs& mine) { return mine; }
  virtual void barrier() {}

  // ---- one optimizer step (the step runner) ----
  // Gradients cleared: the optimizer's, and with ZeRO every parameter's (owners reduce anew).
  virtual void begin_step(model::TransformerLM& model, FusedAdamW& optimizer);
  // The backward of one micro-batch's scaled loss; `last`: the step's last micro-batch.
  virtual void backward(const torch::Tensor& scaled_loss, bool last);
  // After the last backward: the mean gradient over the ranks (ZeRO-2: on the owners only), the
  // step's loss figures averaged and expert loads and drops summed.
  virtual void finish_gradients(model::TransformerLM& model, StepResult& r) {}
  // fp16: an overflow in any rank's gradient share skips the step everywhere.
  virtual void agree_on_overflow(torch::Tensor& found_inf) {}
  // Clipping to max_norm (clip_grad_norm's arithmetic): the global L2 norm before it, and the
  // divisor the optimizer applies as its grad_scale (clip_divisor in optim/gradient_clipping.h):
  // the gradients are left as they are, one pass over them fewer. ZeRO-2 (sharded gradients) and
  // expert-parallel groups scale the gradients here and return no divisor.
  virtual Clipping clip(const std::vector<torch::Tensor>& grads, double max_norm);
  // After the optimizer's update: ZeRO owners broadcast their parameters.
  virtual void after_update() {}

  // ---- checkpoints ----
  // Runs `write` on rank 0 with the optimizer state to write: null = the local optimizer's, or
  // ZeRO's stream gathered from the owners (the other ranks take part in the gather). Every rank
  // returns when rank 0 has written.
  virtual void checkpoint(FusedAdamW& optimizer,
                          const std::function<void(const OptimizerStream*)>& write);
};

}  // namespace moe::parallel
