#include "moe/train/cuda_graph_step.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/kernels/permute.h"
#include "moe/moe/experts.h"
#include "moe/train/step_runner.h"

namespace moe::train {

std::string cuda_graph_ineligible_reason(const config::Config& cfg, const torch::Device& device) {
  if (!device.is_cuda()) return "training runs on the CPU";
  if (!cfg.bf16.enabled) return "bf16.enabled is false (the graph needs bf16 grouped GEMMs)";
  if (!::moe::moe::experts_grouped_mm_supported(device))
    return "the GPU is not sm_90 (the grouped-GEMM experts are enabled on Hopper only)";
  if (cfg.moe.kernels == config::MoeKernels::kReference)
    return "moe.kernels is reference (host-synced routing)";
  if (!kernels::cuda_kernels_compiled()) return "this build has no CUDA kernels";
  if (cfg.moe.capacity_factor > 0) return "moe.capacity_factor > 0 (token counts vary per step)";
  if (cfg.data.reset_attention_at_eod)
    return "data.reset_attention_at_eod is on (masked attention)";
  if (cfg.activation_checkpointing.number_checkpoints > 0)
    return "activation checkpointing is on (its recompute restores RNG state on the host)";
  if (cfg.moe.offload_experts == config::OffloadExperts::kOn)
    return "moe.offload_experts is on (the ring's copies are scheduled from the host)";
  if (cfg.zero_optimization.offload_optimizer.device == config::OffloadDevice::kCpu)
    return "optimizer offload is on (the update runs on the host)";
  if (cfg.training.param_dtype != config::ParamDtype::kFp32)
    return "training.param_dtype is not fp32 (the capturable update steps fp32 weights)";
  if (cfg.optimizer.exp_avg_dtype != config::StateDtype::kFp32 ||
      cfg.optimizer.exp_avg_sq_dtype != config::StateDtype::kFp32)
    return "Adam's moments are not fp32 (only the fused fp32 update is capturable)";
  if (cfg.model.hidden_size % 8 != 0 || config::expert_hidden_size(cfg) % 8 != 0 ||
      cfg.moe.shared_expert_hidden_size % 8 != 0 || cfg.moe.latent_size % 8 != 0)
    return "hidden sizes are not multiples of 8 (no grouped GEMM)";
  return "";
}

struct CudaGraphStep::Graph {
  at::cuda::CUDAGraph graph;
};

CudaGraphStep::CudaGraphStep(std::vector<torch::Tensor> params, optim::FusedAdamW& optimizer,
                             MicroForward forward, int64_t micro_batches,
                             std::vector<int64_t> batch_shape, double max_norm,
                             const torch::Device& device)
    : graph_(std::make_unique<Graph>()),
      params_(std::move(params)),
      optimizer_(optimizer),
      forward_(std::move(forward)),
      max_norm_(max_norm) {
  auto opts = torch::TensorOptions(device);
  for (int64_t i = 0; i < micro_batches; ++i) {
    inputs_.push_back(torch::zeros(batch_shape, opts.dtype(torch::kLong)));
  }
  lr_ = torch::zeros({}, opts.dtype(torch::kFloat));
}

CudaGraphStep::~CudaGraphStep() = default;

void CudaGraphStep::set_input(int64_t micro, const torch::Tensor& tokens) {
  inputs_.at(static_cast<size_t>(micro)).copy_(tokens, /*non_blocking=*/true);
}

// What the graph holds. Every tensor it creates lives in the graph's private pool and keeps its
// address across replays, so the outputs below stay valid views of the latest replay.
void CudaGraphStep::body() {
  const double gas = static_cast<double>(inputs_.size());
  torch::Tensor lm, aux, z;
  std::vector<torch::Tensor> load;
  for (const auto& tokens : inputs_) {
    MicroLosses l = forward_(tokens);
    (l.total / gas).backward();
    lm = lm.defined() ? lm + l.lm.detach() : l.lm.detach();
    aux = aux.defined() ? aux + l.aux.detach() : l.aux.detach();
    z = z.defined() ? z + l.z.detach() : l.z.detach();
    accumulate_loads(load, l.tokens_per_expert);
  }
  torch::NoGradGuard no_grad;
  // The eager runner's clipping (step_runner.h), on the device and folded into the update; a
  // non-finite norm or loss skips the update.
  auto norm = optim::gradient_norm(defined_grads(params_));
  found_inf = (~(norm.isfinite() & lm.isfinite())).to(torch::kFloat);
  const torch::Tensor divisor = optim::clip_divisor(norm, max_norm_);
  optimizer_.step_capturable(lr_, found_inf,
                             divisor.defined() ? std::optional(divisor) : std::nullopt);
  lm_sum = lm;
  aux_sum = aux;
  z_sum = z;
  grad_norm = norm;
  tokens_per_expert = load;
}

bool CudaGraphStep::capture(std::string& why) {
  optimizer_.zero_grad();  // gradients are allocated inside the graph's pool
  const auto device = inputs_.front().device();
  // The private pool is filled from scratch: hand the warm-up steps' cached blocks back first,
  // or the capture would briefly need a second step's worth of memory.
  torch::cuda::synchronize(device.index());
  c10::cuda::CUDACachingAllocator::emptyCache();
  const auto pool = at::cuda::graph_pool_handle();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  {
    at::cuda::CUDAEvent ready;  // the side stream starts after everything queued so far
    ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
    ready.block(side);
  }
  bool ended = false;
  try {
    c10::cuda::CUDAStreamGuard guard(side);
    // Thread-local capture mode: the data loader's threads may touch CUDA (pinned buffers)
    // while we capture; only this thread's unsafe calls invalidate the capture.
    graph_->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      body();
    } catch (...) {
      try {
        graph_->graph.capture_end();
        ended = true;
      } catch (...) {
      }
      throw;
    }
    graph_->graph.capture_end();
    ended = true;
  } catch (const std::exception& e) {
    why = e.what();
    const auto nl = why.find('\n');
    if (nl != std::string::npos) why.resize(nl);
    if (!ended) {
      // capture_end() threw before giving the pool back: leave the allocator's capture mode and
      // free the step's memory here, or the eager fallback would run short of it.
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool);
        c10::cuda::CUDACachingAllocator::releasePool(device.index(), pool);
      } catch (...) {
      }
    }
    graph_->graph.reset();  // releases the pool itself when the capture did end
    optimizer_.zero_grad();
    (void)cudaGetLastError();  // a failed capture may leave an error code behind
    return false;
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(c10::cuda::getCurrentCUDAStream(device.index()));
  return true;
}

void CudaGraphStep::replay(double lr) {
  lr_.fill_(lr);
  graph_->graph.replay();
}

}  // namespace moe::train
