#include "moe/model/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/torch.h>
#include <atomic>

namespace moe::model {

namespace {

std::atomic<int64_t> g_recomputations{0};

struct RngSnapshot {
  at::Tensor cpu, cuda;
  static RngSnapshot take() {
    RngSnapshot s;
    s.cpu = at::detail::getDefaultCPUGenerator().get_state();
    if (at::hasCUDA()) s.cuda = at::globalContext().defaultGenerator(at::kCUDA).get_state();
    return s;
  }
  void restore() const {
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    cpu_gen.set_state(cpu);
    if (cuda.defined()) {
      at::Generator cuda_gen = at::globalContext().defaultGenerator(at::kCUDA);
      cuda_gen.set_state(cuda);
    }
  }
};

// Autocast on the CPU and CUDA (enabled, dtype): the forward's state is the recompute's, as
// torch.utils.checkpoint does. The backward runs after the trainer has switched autocast off, so
// without it a bf16 forward would be recomputed in fp32 (other numerics, other routing).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static AutocastState take() {
    return {
        at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
        at::autocast::get_autocast_dtype(at::kCPU), at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["autocast_cpu"] = cpu;
    ctx->saved_data["autocast_cuda"] = cuda;
    ctx->saved_data["autocast_cpu_dtype"] = static_cast<int64_t>(cpu_dtype);
    ctx->saved_data["autocast_cuda_dtype"] = static_cast<int64_t>(cuda_dtype);
  }
  static AutocastState saved(torch::autograd::AutogradContext* ctx) {
    return {ctx->saved_data["autocast_cpu"].toBool(), ctx->saved_data["autocast_cuda"].toBool(),
            static_cast<at::ScalarType>(ctx->saved_data["autocast_cpu_dtype"].toInt()),
            static_cast<at::ScalarType>(ctx->saved_data["autocast_cuda_dtype"].toInt())};
  }
};

// The forward's autocast for the recompute, the caller's again afterwards (also on a throw).
class AutocastAsIn {
 public:
  explicit AutocastAsIn(const AutocastState& then) : now_(AutocastState::take()) { then.apply(); }
  ~AutocastAsIn() { now_.apply(); }
  AutocastAsIn(const AutocastAsIn&) = delete;
  AutocastAsIn& operator=(const AutocastAsIn&) = delete;

 private:
  AutocastState now_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Outputs: block output, aux loss, z loss, then the per-expert counts (not differentiable).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, int64_t block_ptr,
                                                bool on_host) {
    auto* block = reinterpret_cast<Block*>(block_ptr);
    ctx->saved_data["block"] = block_ptr;
    auto rng = std::make_shared<RngSnapshot>(RngSnapshot::take());
    ctx->saved_data["rng_cpu"] = rng->cpu;
    if (rng->cuda.defined()) ctx->saved_data["rng_cuda"] = rng->cuda;
    AutocastState::take().save(ctx);
    if (on_host && x.is_cuda()) {
      // Stream-ordered: the device buffer may be reused only by work queued after this copy.
      auto host = torch::empty(x.sizes(), x.options().device(torch::kCPU).pinned_memory(true));
      host.copy_(x, /*non_blocking=*/true);
      ctx->saved_data["x_host"] = host;
      ctx->saved_data["x_device"] = static_cast<int64_t>(x.device().index());
    } else {
      ctx->save_for_backward({x});
    }
    BlockOutput o;
    {
      torch::NoGradGuard no_grad;
      o = (*block)->forward(x);
    }
    // The capacity drops travel out as a host scalar (a checkpointed block used to report 0).
    auto dropped = torch::tensor(o.moe.dropped, torch::kLong);
    ctx->mark_non_differentiable({o.moe.tokens_per_expert, dropped});
    return {o.x, o.moe.aux_loss, o.moe.z_loss, o.moe.tokens_per_expert, dropped};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* block = reinterpret_cast<Block*>(ctx->saved_data["block"].toInt());
    torch::Tensor saved;
    if (ctx->saved_data.count("x_host")) {
      const torch::Device device(
          torch::kCUDA, static_cast<c10::DeviceIndex>(ctx->saved_data["x_device"].toInt()));
      saved = ctx->saved_data["x_host"].toTensor().to(device, /*non_blocking=*/true);
    } else {
      saved = ctx->get_saved_variables()[0];
    }
    auto x = saved.detach().requires_grad_(true);
    RngSnapshot now = RngSnapshot::take();
    RngSnapshot then;
    then.cpu = ctx->saved_data["rng_cpu"].toTensor();
    if (ctx->saved_data.count("rng_cuda")) then.cuda = ctx->saved_data["rng_cuda"].toTensor();
    then.restore();
    BlockOutput o;
    {
      torch::AutoGradMode enable(true);
      AutocastAsIn autocast(AutocastState::saved(ctx));
      o = (*block)->forward(x);
    }
    now.restore();
    ++g_recomputations;
    std::vector<torch::Tensor> outs{o.x}, gouts{grads[0]};
    for (auto [t, g] : {std::pair{o.moe.aux_loss, grads[1]}, std::pair{o.moe.z_loss, grads[2]}}) {
      if (g.defined() && t.requires_grad()) {
        outs.push_back(t);
        gouts.push_back(g);
      }
    }
    torch::autograd::backward(outs, gouts);
    return {x.grad(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t checkpoint_recomputations() { return g_recomputations.load(); }

BlockOutput checkpointed_block_forward(Block& block, const torch::Tensor& x, bool on_host) {
  auto outs = CheckpointFunction::apply(x, reinterpret_cast<int64_t>(&block), on_host);
  BlockOutput o;
  o.x = outs[0];
  o.moe.aux_loss = outs[1];
  o.moe.z_loss = outs[2];
  o.moe.tokens_per_expert = outs[3];
  o.moe.dropped = outs[4].item<int64_t>();
  return o;
}

}  // namespace moe::model
