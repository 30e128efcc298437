// A whole training step (forward and backward of every micro-batch, gradient clipping and the
// AdamW update) captured once in a CUDA graph and replayed each step: one launch instead of
// thousands. Static shapes and no host syncs inside: the inputs are fixed device buffers the
// caller fills before each replay; the learning rate is a device scalar; a non-finite norm or
// loss skips the update on the device (found_inf). The caller reads the outputs afterwards.
//
// What a run needs to be captured (ineligible_reason() says which is missing): a CUDA device,
// bf16 (the grouped-GEMM experts keep the counts on the device; fp32 and fp16 runs need host
// counts or a host loss scale), sm_90 (grouped GEMM), moe.kernels on cuda, dropless routing (N = T
// * k rows: fixed shapes), no activation checkpointing (its recompute saves and restores RNG state
// on the host), no optimizer offload (a host update). Anything else runs eagerly, as does a capture
// that fails: capture() reports why and the trainer goes on without the graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/optim/adamw.h"

namespace moe::train {

struct MicroLosses {
  torch::Tensor total, lm, aux, z;               // scalars
  torch::Tensor targets;                         // scalar: positions that took the loss
  std::vector<torch::Tensor> tokens_per_expert;  // per MoE layer [E]
  int64_t dropped = 0;                           // assignments dropped by expert capacity
};
// Forward of one micro-batch [B, S + 1] under the run's autocast; returns its losses.
using MicroForward = std::function<MicroLosses(const torch::Tensor& tokens)>;

// "" when this run's step can be captured, else the first reason it cannot.
std::string cuda_graph_ineligible_reason(const config::Config& cfg, const torch::Device& device);

class CudaGraphStep {
 public:
  CudaGraphStep(std::vector<torch::Tensor> params, optim::FusedAdamW& optimizer,
                MicroForward forward, int64_t micro_batches, std::vector<int64_t> batch_shape,
                double max_norm, const torch::Device& device);
  ~CudaGraphStep();
  // Copies micro-batch `micro` (host, pinned when possible) into its device buffer.
  void set_input(int64_t micro, const torch::Tensor& tokens);
  // Captures the step (the inputs must be set). False with `why` when capture is impossible.
  bool capture(std::string& why);
  // Runs the captured step at learning rate `lr`.
  void replay(double lr);
  int64_t micro_batches() const { return static_cast<int64_t>(inputs_.size()); }
  // Outputs of the last replay (device tensors; read after replay()).
  torch::Tensor lm_sum, aux_sum, z_sum, grad_norm, found_inf;
  std::vector<torch::Tensor> tokens_per_expert;

 private:
  void body();
  struct Graph;
  std::unique_ptr<Graph> graph_;
  std::vector<torch::Tensor> params_;
  optim::FusedAdamW& optimizer_;
  MicroForward forward_;
  std::vector<torch::Tensor> inputs_;
  torch::Tensor lr_;
  double max_norm_;
};

}  // namespace moe::train
