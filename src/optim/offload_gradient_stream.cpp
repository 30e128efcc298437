#include "moe/optim/offload_gradient_stream.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>

namespace moe::optim {

namespace {

// Calls back when autograd has accumulated a parameter's gradient (its AccumulateGrad node).
struct GradientAccumulated : torch::autograd::PostAccumulateGradHook {
  explicit GradientAccumulated(std::function<void()> f) : f_(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { f_(); }
  std::function<void()> f_;
};

}  // namespace

struct OffloadGradientStream::CudaState {
  std::optional<c10::cuda::CUDAStream> copy;
  std::vector<at::cuda::CUDAEvent> copied;  // per parameter: its last gradient copy
};

OffloadGradientStream::OffloadGradientStream(std::vector<torch::Tensor> params, bool pin_memory)
    : params_(std::move(params)), cuda_(std::make_unique<CudaState>()), pin_memory_(pin_memory) {
  const size_t n = params_.size();
  got_.assign(n, 0);
  staged_.assign(n, 0);
  summed_.assign(n, 0);
  cuda_->copied = std::vector<at::cuda::CUDAEvent>(n);
  // Every host buffer in one allocation per dtype (host_arena.h): fp32 gradients, and the
  // 16-bit staging of 16-bit parameters.
  bool on_cuda = false;
  for (const auto& p : params_) on_cuda = on_cuda || p.is_cuda();
  arena_ = HostArena(pin_memory_ && on_cuda);
  std::vector<size_t> fp32_slot(n);
  std::vector<std::optional<size_t>> staging_slot(n);
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor& p = params_[k];
    fp32_slot[k] = arena_.add(p.sizes(), at::kFloat);
    if (p.scalar_type() != at::kFloat) staging_slot[k] = arena_.add(p.sizes(), p.scalar_type());
  }
  arena_.allocate();
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor& p = params_[k];
    host_fp32_.push_back(arena_[fp32_slot[k]]);
    staging16_.push_back(staging_slot[k] ? arena_[*staging_slot[k]] : at::Tensor());
    if (p.requires_grad()) {
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<GradientAccumulated>([this, k] { gradient_ready(k); }));
    }
  }
}

OffloadGradientStream::~OffloadGradientStream() {
  for (const auto& p : params_) {
    if (p.requires_grad()) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

std::optional<torch::Stream> OffloadGradientStream::copy_stream(const torch::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  if (!cuda_->copy) cuda_->copy = c10::cuda::getStreamFromPool(false, device.index());
  return cuda_->copy->unwrap();
}

void OffloadGradientStream::gradient_ready(size_t k) {
  at::Tensor& p = params_[k];
  const at::Tensor grad = p.grad();
  if (!grad.defined()) return;
  const bool sixteen = grad.scalar_type() != at::kFloat;
  if (!sixteen && !last_) return;  // fp32: autograd accumulates on the device until the last
  at::NoGradGuard no_grad;
  add_staged(k);  // this parameter's previous 16-bit copy first: staging is reused
  at::Tensor& dst = sixteen ? staging16_[k] : host_fp32_[k];
  if (grad.is_cuda()) {
    // The copy waits for the kernels that produced the gradient, not for the rest of the
    // backward; the caching allocator keeps a released gradient's memory until it is done.
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(grad.device().index());
    copy_stream(grad.device());
    at::cuda::CUDAEvent produced;
    produced.record(compute);
    produced.block(*cuda_->copy);
    {
      c10::cuda::CUDAStreamGuard guard(*cuda_->copy);
      dst.copy_(grad, /*non_blocking=*/dst.is_pinned());
    }
    cuda_->copied[k].record(*cuda_->copy);
    if (sixteen) grad.record_stream(cuda_->copy->unwrap());
  } else {
    dst.copy_(grad);
  }
  if (sixteen) {  // released: the next accumulation starts a fresh 16-bit gradient
    staged_[k] = 1;
    p.mutable_grad() = at::Tensor();
  }
  got_[k] = 1;
}

void OffloadGradientStream::wait_copy(size_t k) {
  if (params_[k].is_cuda()) cuda_->copied[k].synchronize();
}

void OffloadGradientStream::add_staged(size_t k) {
  if (!staged_[k]) return;
  wait_copy(k);
  // As FusedAdamW::accumulate_micro_batch does on the device: the first copy widened exactly,
  // the later ones added in fp32.
  if (summed_[k]) {
    host_fp32_[k].add_(staging16_[k]);
  } else {
    host_fp32_[k].copy_(staging16_[k]);
  }
  summed_[k] = 1;
  staged_[k] = 0;
}

void OffloadGradientStream::finish() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    // An fp32 gradient from an earlier micro-batch only (an expert no token of the last one
    // reached): its hook did not fire in the last backward, so it is copied now.
    if (!got_[k] && !staging16_[k].defined() && params_[k].grad().defined()) {
      const bool last = last_;
      last_ = true;
      gradient_ready(k);
      last_ = last;
    }
    if (!got_[k]) continue;
    if (staging16_[k].defined()) {
      add_staged(k);
    } else {
      wait_copy(k);
    }
  }
}

void OffloadGradientStream::clear() {
  std::fill(got_.begin(), got_.end(), 0);
  std::fill(staged_.begin(), staged_.end(), 0);
  std::fill(summed_.begin(), summed_.end(), 0);
}

}  // namespace moe::optim
