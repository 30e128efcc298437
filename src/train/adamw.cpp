#include "moe/train/adamw.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "moe/train/blockwise_quant.h"

namespace moe::train {

namespace {

at::Tensor host_buffer(const at::Tensor& like, bool pinned) {
  return at::empty(like.sizes(), at::TensorOptions().dtype(at::kFloat).pinned_memory(pinned));
}

const at::Tensor& moment(const AdamWState& st, int which) {
  return which == 0 ? st.exp_avg : st.exp_avg_sq;
}
const at::Tensor& moment_absmax(const AdamWState& st, int which) {
  return which == 0 ? st.exp_avg_absmax : st.exp_avg_sq_absmax;
}

}  // namespace

at::Tensor moment_fp32(const AdamWState& st, int which) {
  const at::Tensor& t = moment(st, which);
  const at::Tensor& absmax = moment_absmax(st, which);
  if (absmax.defined()) {
    return dequantize_blockwise(t, absmax, dynamic_map(which == 0, t.device()));
  }
  return t.to(at::kFloat);  // an fp32 moment is returned as it is (updated in place)
}

void set_moment(AdamWState& st, int which, const at::Tensor& value) {
  at::Tensor t = moment(st, which);
  at::Tensor absmax = moment_absmax(st, which);
  if (absmax.defined()) {
    quantize_blockwise(value, dynamic_map(which == 0, t.device()), t, absmax);
  } else if (!t.is_same(value)) {
    t.copy_(value);  // bf16: round to nearest even
  }
}

AdamWState FusedAdamW::make_state(const at::Tensor& like) const {
  AdamWState st;
  auto make = [&](config::StateDtype d, at::Tensor& m, at::Tensor& absmax) {
    if (d == config::StateDtype::k8Bit && like.numel() >= kMin8BitNumel) {
      // absmax 0 makes every code read as 0, as bitsandbytes starts its states.
      m = at::zeros(like.sizes(), like.options().dtype(at::kByte));
      absmax = at::zeros({quant_blocks(like.numel())}, like.options().dtype(at::kFloat));
    } else if (d == config::StateDtype::kBf16) {
      m = at::zeros(like.sizes(), like.options().dtype(at::kBFloat16));
    } else {
      m = at::zeros_like(like, at::MemoryFormat::Preserve);
    }
  };
  make(precision_.exp_avg, st.exp_avg, st.exp_avg_absmax);
  make(precision_.exp_avg_sq, st.exp_avg_sq, st.exp_avg_sq_absmax);
  st.step = at::zeros({}, like.options().dtype(at::kFloat));
  return st;
}

FusedAdamW::FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps,
                       OffloadOptions offload, MomentPrecision precision)
    : groups_(std::move(groups)),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      offload_(offload),
      precision_(precision) {
  for (const auto& g : groups_) {
    auto& st = state_.emplace_back();
    auto& master = master_.emplace_back();
    auto& host_grad = host_grad_.emplace_back();
    for (const auto& p : g.params) {
      if (!offload_.enabled) {
        st.push_back(make_state(p));
        continue;
      }
      if (p.scalar_type() != at::kFloat) {
        throw std::invalid_argument("optimizer offload: parameter " + g.names[master.size()] +
                                    " is " + std::string(c10::toString(p.scalar_type())) +
                                    "; fp32 working weights are expected");
      }
      const bool pinned = offload_.pin_memory && p.is_cuda();
      master.push_back(host_buffer(p, pinned));
      master.back().copy_(p.detach());
      host_grad.push_back(host_buffer(p, pinned));
      st.push_back(make_state(master.back()));
    }
  }
}

void FusedAdamW::step(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  if (offload_.enabled) {
    step_offloaded(lr, grad_scale, found_inf);
  } else {
    step_on_device(lr, grad_scale, found_inf);
  }
}

// The tensors of group g whose parameters have a gradient, as the fused kernel takes them.
struct FusedAdamW::Lists {
  std::vector<at::Tensor> params, grads, m, v, steps;
};

FusedAdamW::Lists FusedAdamW::with_grads(size_t g) {
  Lists l;
  for (size_t i = 0; i < groups_[g].params.size(); ++i) {
    const auto& p = groups_[g].params[i];
    if (!p.grad().defined()) continue;
    l.params.push_back(p);
    l.grads.push_back(p.grad());
    l.m.push_back(state_[g][i].exp_avg);
    l.v.push_back(state_[g][i].exp_avg_sq);
    l.steps.push_back(state_[g][i].step);
  }
  return l;
}

// One fused update per group; Lr is a double (host) or a device scalar tensor (capturable):
// ATen has both overloads of _fused_adamw_. As torch.optim's fused path, the step is counted
// first and taken back where found_inf says the update was skipped.
template <typename Lr>
void FusedAdamW::update_groups(const Lr& lr, const std::optional<torch::Tensor>& grad_scale,
                               const std::optional<torch::Tensor>& found_inf) {
  if constexpr (std::is_same_v<Lr, double>) {
    if (!precision_.fp32()) {  // bf16 / 8-bit moments: the reference update, host-side decisions
      if (found_inf && found_inf->item<float>() != 0) return;
      const double scale = grad_scale ? grad_scale->item<double>() : 1.0;
      for (size_t g = 0; g < groups_.size(); ++g) {
        for (size_t i = 0; i < groups_[g].params.size(); ++i) {
          at::Tensor& p = groups_[g].params[i];
          if (!p.grad().defined()) continue;
          update_reference(p, p.grad(), state_[g][i], lr, groups_[g].weight_decay, scale);
        }
      }
      return;
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    Lists l = with_grads(g);
    if (l.params.empty()) continue;
    at::_foreach_add_(l.steps, 1);
    at::_fused_adamw_(l.params, l.grads, l.m, l.v, /*max_exp_avg_sqs=*/{}, l.steps, lr, beta1_,
                      beta2_, groups_[g].weight_decay, eps_, /*amsgrad=*/false,
                      /*maximize=*/false, grad_scale, found_inf);
    if (found_inf) {
      at::_foreach_sub_(l.steps, std::vector<at::Tensor>(l.steps.size(), *found_inf));
    }
  }
}

void FusedAdamW::step_on_device(double lr, const std::optional<torch::Tensor>& grad_scale,
                                const std::optional<torch::Tensor>& found_inf) {
  update_groups(lr, grad_scale, found_inf);
}

void FusedAdamW::step_offloaded(double lr, const std::optional<torch::Tensor>& grad_scale,
                                const std::optional<torch::Tensor>& found_inf) {
  // The scalars travel to the host once (a sync, but the update needs the grads there anyway).
  std::optional<at::Tensor> scale_h, inf_h;
  if (grad_scale) scale_h = grad_scale->to(at::kCPU, at::kFloat);
  if (found_inf) inf_h = found_inf->to(at::kCPU, at::kFloat);

  struct Bucket {
    size_t group;
    std::vector<size_t> index;
  };
  std::vector<Bucket> buckets;
  bool on_cuda = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    int64_t bytes = offload_.bucket_bytes;  // forces a new bucket at each group start
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& p = groups_[g].params[i];
      if (!p.grad().defined()) continue;
      on_cuda = on_cuda || p.is_cuda();
      if (bytes >= offload_.bucket_bytes) {
        buckets.push_back({g, {}});
        bytes = 0;
      }
      buckets.back().index.push_back(i);
      bytes += p.numel() * static_cast<int64_t>(sizeof(float));
    }
  }

  auto update = [&](const Bucket& b) {
    if (!precision_.fp32()) {
      if (inf_h && inf_h->item<float>() != 0) return;
      const double scale = scale_h ? scale_h->item<double>() : 1.0;
      for (size_t i : b.index) {
        update_reference(master_[b.group][i], host_grad_[b.group][i], state_[b.group][i], lr,
                         groups_[b.group].weight_decay, scale);
      }
      return;
    }
    std::vector<at::Tensor> masters, grads, m, v, steps;
    for (size_t i : b.index) {
      masters.push_back(master_[b.group][i]);
      grads.push_back(host_grad_[b.group][i]);
      m.push_back(state_[b.group][i].exp_avg);
      v.push_back(state_[b.group][i].exp_avg_sq);
      steps.push_back(state_[b.group][i].step);
    }
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(masters, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1_, beta2_,
                      groups_[b.group].weight_decay, eps_, /*amsgrad=*/false,
                      /*maximize=*/false, scale_h, inf_h);
    if (inf_h) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *inf_h));
  };
  auto copy_grads = [&](const Bucket& b, bool non_blocking) {
    for (size_t i : b.index) {
      host_grad_[b.group][i].copy_(groups_[b.group].params[i].grad(), non_blocking);
    }
  };
  auto copy_weights_back = [&](const Bucket& b, bool non_blocking) {
    for (size_t i : b.index) groups_[b.group].params[i].copy_(master_[b.group][i], non_blocking);
  };

  if (!on_cuda) {  // a CPU run: the same path with host-to-host copies (what the tests exercise)
    for (const auto& b : buckets) {
      copy_grads(b, false);
      update(b);
      copy_weights_back(b, false);
    }
    return;
  }
  // Device-to-host copies of every bucket are queued on a side stream after the backward pass;
  // bucket b is updated as soon as its own copies have landed, and its weights go back on the
  // same stream while the CPU works on bucket b+1. The compute stream waits for the last copy.
  const auto device = groups_[buckets.front().group].params[buckets.front().index.front()].device();
  c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent grads_ready;
  grads_ready.record(compute);
  grads_ready.block(copy);
  std::vector<at::cuda::CUDAEvent> arrived(buckets.size());
  {
    c10::cuda::CUDAStreamGuard guard(copy);
    for (size_t b = 0; b < buckets.size(); ++b) {
      copy_grads(buckets[b], offload_.pin_memory);
      arrived[b].record(copy);
    }
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    arrived[b].synchronize();
    update(buckets[b]);
    c10::cuda::CUDAStreamGuard guard(copy);
    copy_weights_back(buckets[b], offload_.pin_memory);
  }
  at::cuda::CUDAEvent weights_back;
  weights_back.record(copy);
  weights_back.block(compute);
  // A later step's copies wait on the compute stream, which now waits on these: the pinned
  // master buffers are not rewritten before their copies to the device have finished.
}

// The AdamW step in fp32 as bitsandbytes' CPU Adam takes it (its 8-bit blockwise update): the
// moments first, then decoupled weight decay and the bias-corrected step.
void FusedAdamW::update_reference(at::Tensor& param, const at::Tensor& grad, AdamWState& st,
                                  double lr, double weight_decay, double grad_scale) {
  at::Tensor g = grad.to(at::kFloat);
  if (grad_scale != 1.0) g = g / grad_scale;
  st.step.add_(1);
  const double t = st.step.item<double>();
  at::Tensor m = moment_fp32(st, 0);
  at::Tensor v = moment_fp32(st, 1);
  m.mul_(beta1_).add_(g, 1.0 - beta1_);
  v.mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
  const double correction1 = 1.0 - std::pow(beta1_, t);
  const double correction2 = std::sqrt(1.0 - std::pow(beta2_, t));
  const at::Tensor denom = (v.sqrt() / correction2).add_(eps_);
  if (weight_decay > 0.0) param.mul_(1.0 - lr * weight_decay);
  param.addcdiv_(m, denom, -lr / correction1);
  set_moment(st, 0, m);
  set_moment(st, 1, v);
}

void FusedAdamW::step_capturable(const torch::Tensor& lr, const torch::Tensor& found_inf) {
  TORCH_CHECK(!offload_.enabled, "optimizer: the capturable step does not support offload");
  TORCH_CHECK(precision_.fp32(), "optimizer: the capturable step needs fp32 moments");
  at::NoGradGuard no_grad;
  update_groups(lr, std::nullopt, found_inf);
}

void FusedAdamW::reload_master_weights() {
  if (!offload_.enabled) return;
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      master_[g][i].copy_(groups_[g].params[i].detach());
    }
  }
}

void FusedAdamW::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) p.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, AdamWState*>> FusedAdamW::named_state() {
  std::vector<std::pair<std::string, AdamWState*>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      out.emplace_back(groups_[g].names[i], &state_[g][i]);
    }
  }
  return out;
}

}  // namespace moe::train
