#include "moe/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "moe/kernels/adam8bit.h"
#include "moe/kernels/permute.h"
#include "moe/optim/host_arena.h"
#include "moe/optim/offload_gradient_stream.h"
#include "moe/quant/blockwise_quant.h"

namespace moe::optim {

namespace {

bool held_in_16_bits(const at::Tensor& p) { return p.scalar_type() != at::kFloat; }

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
    return quant::dequantize_blockwise(t, absmax, quant::dynamic_map(which == 0, t.device()));
  }
  return t.to(at::kFloat);  // an fp32 moment is returned as it is (updated in place)
}

void set_moment(AdamWState& st, int which, const at::Tensor& value) {
  at::Tensor t = moment(st, which);
  at::Tensor absmax = moment_absmax(st, which);
  if (absmax.defined()) {
    quant::quantize_blockwise(value, quant::dynamic_map(which == 0, t.device()), t, absmax);
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
      absmax = at::zeros({quant::quant_blocks(like.numel())}, like.options().dtype(at::kFloat));
    } else if (d == config::StateDtype::kBf16) {
      m = at::zeros(like.sizes(), like.options().dtype(at::kBFloat16));
    } else {  // fp32 moments, also of a 16-bit parameter
      m = at::zeros(like.sizes(), like.options().dtype(at::kFloat));
    }
  };
  make(precision_.exp_avg, st.exp_avg, st.exp_avg_absmax);
  make(precision_.exp_avg_sq, st.exp_avg_sq, st.exp_avg_sq_absmax);
  // The fused kernel reads the step on the parameter's device; the reference update counts it on
  // the host (as torch.optim's non-capturable AdamW keeps it on the CPU): no sync per parameter.
  st.step = at::zeros({}, precision_.fp32() ? like.options().dtype(at::kFloat)
                                            : at::TensorOptions().dtype(at::kFloat));
  return st;
}

FusedAdamW::FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps,
                       OffloadOptions offload, MomentPrecision precision,
                       MainParamsDtype main_params)
    : groups_(std::move(groups)),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      offload_(offload),
      precision_(precision),
      main_params_(main_params) {
  at::NoGradGuard no_grad;
  bool on_cuda = false;
  for (const auto& g : groups_) {
    for (const auto& p : g.params) on_cuda = on_cuda || p.is_cuda();
  }
  // Offload's host buffers: page-locked only where there is a device to copy to and from.
  const bool pinned = offload_.enabled && offload_.pin_memory && on_cuda;
  host_masters_ = HostArena(pinned);
  host_staging_ = HostArena(pinned);
  for (const auto& g : groups_) {
    auto& master = master_.emplace_back();
    auto& compensation = compensation_.emplace_back();
    host_grad_.emplace_back(g.params.size());
    grad_sum_.emplace_back(g.params.size());
    for (size_t i = 0; i < g.params.size(); ++i) {
      const at::Tensor p = g.params[i].detach();
      const bool sixteen = held_in_16_bits(p);
      sixteen_bit_ += sixteen ? 1 : 0;
      if (sixteen && main_params_ == MainParamsDtype::kBf16 && p.scalar_type() != at::kBFloat16) {
        throw std::invalid_argument("optimizer: a bf16 master needs bf16 weights; " + g.names[i] +
                                    " is " + std::string(c10::toString(p.scalar_type())));
      }
      const bool kahan = sixteen && main_params_ == MainParamsDtype::kBf16;
      compensation.push_back(kahan ? at::zeros_like(p) : at::Tensor());
      if (offload_.enabled) {  // every fp32 master on the host, in one buffer (below)
        host_masters_.add(p.sizes(), at::kFloat);
        master.emplace_back();
      } else {
        master.push_back(sixteen && !kahan ? p.to(at::kFloat) : at::Tensor());
      }
    }
  }
  if (offload_.enabled) {
    host_masters_.allocate();
    size_t k = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        master_[g][i] = host_masters_[k++];
        master_[g][i].copy_(groups_[g].params[i].detach());
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& st = state_.emplace_back();
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const at::Tensor& m = master_[g][i];
      st.push_back(make_state(m.defined() ? m : groups_[g].params[i].detach()));
    }
  }
}

FusedAdamW::~FusedAdamW() = default;

void FusedAdamW::stream_gradients_in_backward() {
  TORCH_CHECK(offload_.enabled, "optimizer: gradient streaming needs offload");
  std::vector<at::Tensor> params;
  first_slot_.clear();
  for (auto& g : groups_) {
    first_slot_.push_back(params.size());
    for (const auto& p : g.params) {
      slot_of_[p.unsafeGetTensorImpl()] = params.size();
      params.push_back(p);
    }
  }
  TORCH_CHECK(!host_staging_.allocated(), "optimizer: gradient streaming after a step");
  // The stream's fp32 gradients and 16-bit staging take the place of host_grad_, which is never
  // allocated then.
  stream_ = std::make_unique<OffloadGradientStream>(std::move(params), offload_.pin_memory);
}

void FusedAdamW::begin_backward(bool last) {
  if (stream_) stream_->begin_backward(last);
}

void FusedAdamW::finish_streamed_gradients() {
  TORCH_CHECK(stream_, "optimizer: gradients are not streamed");
  stream_->finish();
}

at::Tensor FusedAdamW::streamed_gradient(const at::Tensor& param) const {
  const auto it = slot_of_.find(param.unsafeGetTensorImpl());
  if (!stream_ || it == slot_of_.end() || !stream_->has_gradient(it->second)) return {};
  return stream_->host_gradient(it->second);
}

namespace {

// The reference update's step count, kept on the host (make_state): advanced without a sync.
double advance_host_step(AdamWState& st) {
  TORCH_CHECK(st.step.is_cpu(), "optimizer: the reference update counts steps on the host");
  float* step = st.step.data_ptr<float>();
  *step += 1.0f;
  return *step;
}

}  // namespace

// The values the reference update needs on the host, read once per step in one transfer (the
// fused kernel takes the tensors themselves and needs none).
FusedAdamW::Scaling FusedAdamW::scaling(const std::optional<at::Tensor>& grad_scale,
                                        const std::optional<at::Tensor>& found_inf) const {
  Scaling s{grad_scale, found_inf};
  if (precision_.fp32() || (!grad_scale && !found_inf)) return s;
  std::vector<at::Tensor> parts;
  for (const auto& t : {grad_scale, found_inf}) {
    if (t) parts.push_back(t->detach().reshape({1}).to(at::kDouble));
  }
  const at::Tensor host = at::cat(parts).to(at::kCPU);
  const double* v = host.data_ptr<double>();
  if (grad_scale) s.divisor = v[0];
  if (found_inf) s.skip = v[grad_scale ? 1 : 0] != 0;
  return s;
}

void FusedAdamW::step(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  if (offload_.enabled) {
    step_offloaded(lr, grad_scale, found_inf);
  } else {
    update_groups(lr, scaling(grad_scale, found_inf));
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
    if (!p.grad().defined() || held_in_16_bits(p)) continue;  // 16-bit: update_16bit
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
void FusedAdamW::update_groups(const Lr& lr, const Scaling& s) {
  if constexpr (std::is_same_v<Lr, double>) {
    if (!precision_.fp32()) {  // bf16 / 8-bit moments: the reference update, host-side decisions
      if (s.skip) return;
      for (size_t g = 0; g < groups_.size(); ++g) {
        for (size_t i = 0; i < groups_[g].params.size(); ++i) {
          at::Tensor& p = groups_[g].params[i];
          if (!p.grad().defined() || held_in_16_bits(p)) continue;
          update_reference(p, p.grad(), state_[g][i], lr, groups_[g].weight_decay, s.divisor);
        }
      }
    }
    for (size_t g = 0; g < groups_.size() && sixteen_bit_ > 0; ++g) update_16bit(g, lr, s);
    if (!precision_.fp32()) return;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    Lists l = with_grads(g);
    if (l.params.empty()) continue;
    at::_foreach_add_(l.steps, 1);
    at::_fused_adamw_(l.params, l.grads, l.m, l.v, /*max_exp_avg_sqs=*/{}, l.steps, lr, beta1_,
                      beta2_, groups_[g].weight_decay, eps_, /*amsgrad=*/false,
                      /*maximize=*/false, s.grad_scale, s.found_inf);
    if (s.found_inf) {
      at::_foreach_sub_(l.steps, std::vector<at::Tensor>(l.steps.size(), *s.found_inf));
    }
  }
}

// The parameters with a gradient this step, in buckets of about offload_.bucket_bytes of fp32
// (a new bucket at each group start); on_cuda: whether any of them is on a GPU.
std::vector<FusedAdamW::OffloadBucket> FusedAdamW::offload_buckets(bool& on_cuda) const {
  std::vector<OffloadBucket> buckets;
  for (size_t g = 0; g < groups_.size(); ++g) {
    int64_t bytes = offload_.bucket_bytes;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& p = groups_[g].params[i];
      if (!(stream_ ? stream_->has_gradient(first_slot_[g] + i) : p.grad().defined())) continue;
      on_cuda = on_cuda || p.is_cuda();
      if (bytes >= offload_.bucket_bytes) {
        buckets.push_back({g, {}});
        bytes = 0;
      }
      buckets.back().index.push_back(i);
      bytes += p.numel() * static_cast<int64_t>(sizeof(float));
    }
  }
  return buckets;
}

// The gradients' host staging of the copied-after-the-backward path, in one buffer per dtype,
// made at the first step (a streamed run never needs it): fp32 for fp32 parameters and for
// 16-bit ones whose gradients are fp32 sums, the parameter's dtype otherwise.
void FusedAdamW::allocate_host_staging() {
  if (host_staging_.allocated()) return;
  for (const auto& g : groups_) {
    for (const auto& p : g.params) {
      const bool narrow = held_in_16_bits(p) && !offload_.fp32_gradient_sums;
      host_staging_.add(p.sizes(), narrow ? p.scalar_type() : at::kFloat);
    }
  }
  host_staging_.allocate();
  size_t k = 0;
  for (auto& staged : host_grad_) {
    for (auto& t : staged) t = host_staging_[k++];
  }
}

void FusedAdamW::step_offloaded(double lr, const std::optional<torch::Tensor>& grad_scale,
                                const std::optional<torch::Tensor>& found_inf) {
  // The scalars travel to the host once (a sync, but the update needs the grads there anyway).
  std::optional<at::Tensor> scale_h, inf_h;
  if (grad_scale) scale_h = grad_scale->to(at::kCPU, at::kFloat);
  if (found_inf) inf_h = found_inf->to(at::kCPU, at::kFloat);
  const Scaling scaling_h = scaling(scale_h, inf_h);
  if (!stream_) allocate_host_staging();

  bool on_cuda = false;
  const std::vector<OffloadBucket> buckets = offload_buckets(on_cuda);
  using Bucket = OffloadBucket;

  auto update = [&](const Bucket& b) {
    std::vector<at::Tensor> masters, grads;
    std::vector<AdamWState*> states;
    for (size_t i : b.index) {
      masters.push_back(master_[b.group][i]);
      // Streamed: the host fp32 gradient; otherwise the staging, a 16-bit one widened here.
      grads.push_back(stream_ ? stream_->host_gradient(first_slot_[b.group] + i)
                              : host_grad_[b.group][i].to(at::kFloat));
      states.push_back(&state_[b.group][i]);
    }
    adam_fp32(masters, grads, states, lr, groups_[b.group].weight_decay, scaling_h);
  };
  auto copy_grads = [&](const Bucket& b, bool non_blocking) {
    if (stream_) return;  // on the host already (copied during the backward)
    for (size_t i : b.index) {
      const at::Tensor& grad = groups_[b.group].params[i].grad();
      at::Tensor& staged = host_grad_[b.group][i];
      if (c10::elementSize(staged.scalar_type()) < c10::elementSize(grad.scalar_type())) {
        // An fp32 sum where 16-bit gradients were expected (OffloadOptions::fp32_gradient_sums
        // unset): a buffer of its own rather than a rounded gradient; counted in host_bytes().
        TORCH_WARN_ONCE(
            "optimizer offload: fp32 gradients of 16-bit parameters were not "
            "planned for; their host staging is allocated separately");
        staged = host_buffer(grad.numel(), grad.scalar_type(), host_staging_.pinned())
                     .view(grad.sizes());
        extra_host_bytes_ += grad.numel() * static_cast<int64_t>(grad.element_size());
      }
      staged.copy_(grad, non_blocking);  // a 16-bit gradient into fp32 staging widens exactly
    }
  };
  // 16-bit weights travel back in 16 bits: rounded on the host into the staging buffer (its
  // gradient is consumed), then copied; fp32 weights go back from the master itself.
  auto copy_weights_back = [&](const Bucket& b, bool non_blocking) {
    for (size_t i : b.index) {
      at::Tensor& p = groups_[b.group].params[i];
      at::Tensor& staged =
          stream_ ? stream_->staging(first_slot_[b.group] + i) : host_grad_[b.group][i];
      if (held_in_16_bits(p) && staged.defined() && staged.scalar_type() == p.scalar_type()) {
        staged.copy_(master_[b.group][i]);
        p.copy_(staged, non_blocking);
      } else {
        p.copy_(master_[b.group][i], non_blocking);
      }
    }
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
  // The stream's own copy stream when gradients were streamed: the next step's gradient copies
  // into the 16-bit staging are then ordered after this step's weight copies out of it.
  c10::cuda::CUDAStream copy = stream_ ? c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED,
                                                               *stream_->copy_stream(device))
                                       : c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent grads_ready;
  grads_ready.record(compute);
  grads_ready.block(copy);
  std::vector<at::cuda::CUDAEvent> arrived(buckets.size());
  {
    c10::cuda::CUDAStreamGuard guard(copy);
    for (size_t b = 0; b < buckets.size(); ++b) {
      copy_grads(buckets[b], host_staging_.pinned());
      arrived[b].record(copy);
    }
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    arrived[b].synchronize();
    update(buckets[b]);
    c10::cuda::CUDAStreamGuard guard(copy);
    copy_weights_back(buckets[b], host_masters_.pinned());
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
  const double t = advance_host_step(st);
  if (precision_.cuda_kernel && param.is_cuda() && st.exp_avg_absmax.defined() &&
      st.exp_avg_sq_absmax.defined() && kernels::cuda_kernels_compiled()) {
    kernels::Adam8bitScalars s;
    s.beta1 = static_cast<float>(beta1_);
    s.beta2 = static_cast<float>(beta2_);
    s.eps = static_cast<float>(eps_);
    s.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    s.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    s.correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(beta2_, t)));
    s.step_size = static_cast<float>(-lr / (1.0 - std::pow(beta1_, t)));
    s.decay = static_cast<float>(1.0 - lr * weight_decay);
    s.weight_decay = weight_decay > 0.0;
    s.grad_scale = static_cast<float>(grad_scale);
    const at::Tensor g = grad.to(at::kFloat).contiguous();
    kernels::detail::adam8bit_step(param, g, st.exp_avg, st.exp_avg_absmax, st.exp_avg_sq,
                                   st.exp_avg_sq_absmax, quant::dynamic_map(true, param.device()),
                                   quant::dynamic_map(false, param.device()), s);
    return;
  }
  at::Tensor g = grad.to(at::kFloat);
  if (grad_scale != 1.0) g = g / grad_scale;
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

// Adam on fp32 tensors `w` (masters or fp32 views of bf16 weights) with fp32 gradients `g`.
void FusedAdamW::adam_fp32(std::vector<at::Tensor>& w, std::vector<at::Tensor>& g,
                           std::vector<AdamWState*>& st, double lr, double weight_decay,
                           const Scaling& s) {
  if (w.empty()) return;
  if (!precision_.fp32()) {
    if (s.skip) return;
    for (size_t k = 0; k < w.size(); ++k) {
      update_reference(w[k], g[k], *st[k], lr, weight_decay, s.divisor);
    }
    return;
  }
  std::vector<at::Tensor> m, v, steps;
  for (AdamWState* a : st) {
    m.push_back(a->exp_avg);
    v.push_back(a->exp_avg_sq);
    steps.push_back(a->step);
  }
  at::_foreach_add_(steps, 1);
  at::_fused_adamw_(w, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1_, beta2_, weight_decay,
                    eps_, /*amsgrad=*/false, /*maximize=*/false, s.grad_scale, s.found_inf);
  if (s.found_inf) {
    at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *s.found_inf));
  }
}

// 16-bit parameters of group g, about bucket_bytes of fp32 at a time: each gradient widened to
// fp32, the master (or an fp32 view of a bf16 master) stepped, the weight rounded from it.
void FusedAdamW::update_16bit(size_t g, double lr, const Scaling& s) {
  std::vector<at::Tensor> w, grads;
  std::vector<AdamWState*> states;
  std::vector<size_t> index;
  int64_t bytes = 0;
  auto flush = [&] {
    adam_fp32(w, grads, states, lr, groups_[g].weight_decay, s);
    for (size_t k = 0; k < index.size(); ++k) {
      at::Tensor p = groups_[g].params[index[k]].detach();
      at::Tensor& comp = compensation_[g][index[k]];
      if (!comp.defined()) {
        p.copy_(w[k]);  // round to nearest even from the fp32 master
        continue;
      }
      // Kahan: the step taken (fp32) plus the carried error, added in fp32, rounded to bf16;
      // what the rounding lost is carried to the next step.
      const at::Tensor old = p.to(at::kFloat);
      at::Tensor y = (w[k] - old).add_(comp.to(at::kFloat));
      const at::Tensor updated = (old + y).to(p.scalar_type());
      comp.copy_(y.sub_(updated.to(at::kFloat) - old));
      p.copy_(updated);
    }
    w.clear();
    grads.clear();
    states.clear();
    index.clear();
    bytes = 0;
  };
  for (size_t i = 0; i < groups_[g].params.size(); ++i) {
    const at::Tensor& p = groups_[g].params[i];
    if (!held_in_16_bits(p) || !p.grad().defined()) continue;
    const at::Tensor& master = master_[g][i];
    w.push_back(master.defined() ? master : p.detach().to(at::kFloat));
    grads.push_back(p.grad().to(at::kFloat));
    states.push_back(&state_[g][i]);
    index.push_back(i);
    bytes += p.numel() * static_cast<int64_t>(sizeof(float)) * (master.defined() ? 1 : 2);
    if (bytes >= offload_.bucket_bytes) flush();
  }
  flush();
}

void FusedAdamW::accumulate_micro_batch(bool last) {
  if (sixteen_bit_ == 0) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      at::Tensor& p = groups_[g].params[i];
      if (!held_in_16_bits(p)) continue;
      at::Tensor& sum = grad_sum_[g][i];
      if (p.grad().defined()) {
        if (sum.defined()) {
          sum.add_(p.grad());
        } else {
          sum = p.grad().to(at::kFloat);
        }
        p.mutable_grad() = at::Tensor();
      }
      if (last && sum.defined()) {  // the fp32 sum is the gradient from here on
        p.mutable_grad() = sum;
        sum = at::Tensor();
      }
    }
  }
}

std::pair<size_t, size_t> FusedAdamW::locate(const std::string& name) const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].names.size(); ++i) {
      if (groups_[g].names[i] == name) return {g, i};
    }
  }
  throw std::out_of_range("optimizer: no parameter " + name);
}

at::Tensor FusedAdamW::master_weight_host(const std::string& name) const {
  const auto [g, i] = locate(name);
  const at::Tensor p = groups_[g].params[i].detach();
  if (!held_in_16_bits(p)) return at::Tensor();
  if (master_[g][i].defined()) return master_[g][i].to(at::kCPU);
  // A bf16 master: the weight plus its compensation, added in fp32 (exact for all but the
  // smallest compensations, and load_master_weight recovers the weight either way).
  return p.to(at::kCPU, at::kFloat) + compensation_[g][i].to(at::kCPU, at::kFloat);
}

void FusedAdamW::load_master_weight(const std::string& name, const at::Tensor& value,
                                    const std::optional<at::Tensor>& compensation) {
  at::NoGradGuard no_grad;
  const auto [g, i] = locate(name);
  at::Tensor p = groups_[g].params[i].detach();
  if (!held_in_16_bits(p)) return;
  if (master_[g][i].defined()) {
    master_[g][i].copy_(value);
    p.copy_(master_[g][i]);
    return;
  }
  // bf16 master: value = weight + compensation in fp32, so value - compensation rounds back to
  // the weight exactly; an fp32 checkpoint (no compensation) gives the rounded value and the
  // rounding error as the compensation.
  const at::Tensor v = value.to(p.device(), at::kFloat);
  const at::Tensor c = compensation ? compensation->to(p.device(), at::kFloat)
                                    : v - v.to(p.scalar_type()).to(at::kFloat);
  p.copy_(v - c);
  compensation_[g][i].copy_(c);
}

std::vector<std::pair<std::string, at::Tensor>> FusedAdamW::named_compensation() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (compensation_[g][i].defined()) out.emplace_back(groups_[g].names[i], compensation_[g][i]);
    }
  }
  return out;
}

void FusedAdamW::step_capturable(const torch::Tensor& lr, const torch::Tensor& found_inf,
                                 const std::optional<torch::Tensor>& grad_scale) {
  TORCH_CHECK(!offload_.enabled, "optimizer: the capturable step does not support offload");
  TORCH_CHECK(sixteen_bit_ == 0, "optimizer: the capturable step needs fp32 working weights");
  TORCH_CHECK(precision_.fp32(), "optimizer: the capturable step needs fp32 moments");
  at::NoGradGuard no_grad;
  update_groups(lr, Scaling{grad_scale, found_inf});
}

void FusedAdamW::reload_master_weights() {
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (master_[g][i].defined()) master_[g][i].copy_(groups_[g].params[i].detach());
      if (compensation_[g][i].defined()) compensation_[g][i].zero_();
    }
  }
}

void FusedAdamW::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) p.mutable_grad() = at::Tensor();
  }
  for (auto& sums : grad_sum_) {
    for (auto& s : sums) s = at::Tensor();
  }
  if (stream_) stream_->clear();
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

int64_t FusedAdamW::host_bytes() const {
  if (!offload_.enabled) return 0;
  int64_t bytes = host_masters_.bytes() + host_staging_.bytes() + extra_host_bytes_;
  if (stream_) bytes += stream_->host_bytes();
  for (const auto& group : state_) {
    for (const AdamWState& st : group) {
      for (const at::Tensor* t :
           {&st.exp_avg, &st.exp_avg_sq, &st.exp_avg_absmax, &st.exp_avg_sq_absmax}) {
        if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
      }
    }
  }
  return bytes;
}

}  // namespace moe::optim
