#include "moe/moe/experts.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include "moe/kernels/clamped_swiglu.h"
#include "moe/kernels/swiglu.h"

namespace moe::moe {

namespace {

// [a | b] along the last dimension in bf16, cast straight into one buffer: at::cat of two casts
// would hold both bf16 halves beside it for a moment (E d 2f bf16 more per layer, again in each
// recomputation). The backward widens each half of the gradient back to its input's dtype.
class ConcatBf16 : public torch::autograd::Function<ConcatBf16> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b) {
    const int64_t fa = a.size(-1), fb = b.size(-1);
    auto sizes = a.sizes().vec();
    sizes.back() = fa + fb;
    auto out = at::empty(sizes, a.options().dtype(torch::kBFloat16));
    out.narrow(-1, 0, fa).copy_(a);
    out.narrow(-1, fa, fb).copy_(b);
    ctx->saved_data["fa"] = fa;
    ctx->saved_data["fb"] = fb;
    ctx->saved_data["a_dtype"] = a.scalar_type();
    ctx->saved_data["b_dtype"] = b.scalar_type();
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t fa = ctx->saved_data["fa"].toInt(), fb = ctx->saved_data["fb"].toInt();
    torch::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) {
      ga = grads[0].narrow(-1, 0, fa).to(ctx->saved_data["a_dtype"].toScalarType());
    }
    if (ctx->needs_input_grad(1)) {
      gb = grads[0].narrow(-1, fa, fb).to(ctx->saved_data["b_dtype"].toScalarType());
    }
    return {ga, gb};
  }
};

// Expert-ordered bf16 rows through one projection of every expert (grouped GEMM): a 4-bit
// stack, an offloaded 16-bit one (fetched from the ring), or the stack itself.
torch::Tensor grouped_projection(const torch::Tensor& xb, const torch::Tensor& w,
                                 const layers::QuantizedWeightPtr& q,
                                 const layers::OffloadedPlace& place, const torch::Tensor& offs) {
  if (q) return layers::grouped_linear_4bit(xb, q, offs);
  if (place) return layers::frozen_grouped_mm(xb, place, offs);
  return at::_grouped_mm(xb, w.to(torch::kBFloat16), offs);
}

}  // namespace

torch::Tensor concat_bf16(const torch::Tensor& a, const torch::Tensor& b) {
  return ConcatBf16::apply(a, b);
}

ExpertsImpl::ExpertsImpl(const ExpertsOptions& opt) : opt_(opt) {
  const int64_t E = opt.num_experts, d = opt.hidden_size, f = opt.ffn_size;
  const int64_t held = opt.local_experts < 0 ? E : opt.local_experts;
  TORCH_CHECK(opt.first_expert >= 0 && opt.first_expert + held <= E, "experts [", opt.first_expert,
              ", ", opt.first_expert + held, ") outside ", E);
  auto stack = [&](std::initializer_list<int64_t> shape, double std) {
    auto t = torch::randn(shape) * std;
    return held == E ? t : t.narrow(0, opt.first_expert, held).clone();
  };
  const bool gated = opt.activation != config::ExpertActivation::kRelu2;
  if (gated) w_gate = register_parameter("w_gate", stack({E, d, f}, opt.init_std));
  w_up = register_parameter("w_up", stack({E, d, f}, opt.init_std));
  w_down = register_parameter("w_down", stack({E, f, d}, opt.output_init_std));
  if (opt.bias) {  // zeros, as transformers initialises gpt-oss's expert biases
    b_gate = register_parameter("b_gate", torch::zeros({held, f}));
    b_up = register_parameter("b_up", torch::zeros({held, f}));
    b_down = register_parameter("b_down", torch::zeros({held, d}));
  }
  opt_.num_experts = held;  // forward() runs the experts held here
  if (opt.lora_gate_up.r > 0) {
    lora_gate_up = register_module("lora_gate_up",
                                   layers::ExpertLora(E, d, (gated ? 2 : 1) * f, opt.lora_gate_up));
  }
  if (opt.lora_down.r > 0) {
    lora_down = register_module("lora_down", layers::ExpertLora(E, f, d, opt.lora_down));
  }
}

void ExpertsImpl::offload_to(const std::shared_ptr<layers::OffloadRing>& ring, int64_t layer) {
  TORCH_CHECK(ring, "offload_to: no ring");
  ring_ = ring;
  if (gate_4bit || up_4bit || down_4bit) {
    // Each 4-bit state's tensors in turn; the ring holds the states weakly (each holds the ring).
    int64_t first = 0;
    std::vector<std::weak_ptr<layers::QuantizedWeight>> states;
    for (const auto& q : {gate_4bit, up_4bit, down_4bit}) {
      if (!q) continue;
      q->offload({ring, layer, first});
      first += static_cast<int64_t>(q->state_tensors().size());
      states.push_back(q);
    }
    ring->add_layer(layer, [states] {
      std::vector<torch::Tensor*> tensors;
      for (const auto& weak : states) {
        if (const auto q = weak.lock()) {
          for (torch::Tensor* t : q->state_tensors()) tensors.push_back(t);
        }
      }
      return tensors;
    });
    return;
  }
  // 16-bit stacks: handles of the parameters' own tensors, so that what the ring packs them into
  // is what the parameters hold (checkpoints, export and loading read and write it there).
  TORCH_CHECK(!w_up.requires_grad(), "offload_to: the experts train; only a frozen base moves");
  int64_t first = 0;
  if (w_gate.defined()) gate_place_ = {ring, layer, first++};
  up_place_ = {ring, layer, first++};
  down_place_ = {ring, layer, first++};
  ring->add_layer(layer, [gate = w_gate, up = w_up, down = w_down]() mutable {
    std::vector<torch::Tensor*> tensors;
    if (gate.defined()) tensors.push_back(&gate);
    tensors.push_back(&up);
    tensors.push_back(&down);
    return tensors;
  });
}

void ExpertsImpl::to(torch::Device device, bool non_blocking) {
  if (!up_place_) {
    torch::nn::Module::to(device, non_blocking);
    return;
  }
  for (auto& child : children()) child->to(device, non_blocking);
  for (auto& item : named_parameters(/*recurse=*/false)) {
    const std::string& name = item.key();
    if (name == "w_gate" || name == "w_up" || name == "w_down") continue;  // the ring's
    item.value().set_data(item.value().to(device, non_blocking));
  }
  for (auto& item : named_buffers(/*recurse=*/false)) {
    item.value().set_data(item.value().to(device, non_blocking));
  }
}

torch::Tensor ExpertsImpl::expert_matmul(const torch::Tensor& x,
                                         const std::vector<torch::Tensor>& stack,
                                         const layers::OffloadedPlace& place, int64_t e) const {
  return place ? layers::frozen_expert_matmul(x, place, e)
               : x.matmul(stack[static_cast<size_t>(e)]);
}

void ExpertsImpl::merge_lora() {
  TORCH_CHECK(!gate_4bit && !up_4bit && !down_4bit, "merge_lora: dequantize the 4-bit base first");
  if (ring_) ring_->invalidate();  // the host stacks change in place below
  torch::NoGradGuard g;
  const int64_t f = opt_.ffn_size;
  if (lora_gate_up) {
    const auto delta = lora_gate_up->delta_weight();
    if (w_gate.defined()) {
      w_gate.add_(delta.narrow(2, 0, f).to(w_gate.scalar_type()));
      w_up.add_(delta.narrow(2, f, f).to(w_up.scalar_type()));
    } else {  // relu2: the adapter is up's alone
      w_up.add_(delta.to(w_up.scalar_type()));
    }
    lora_gate_up->zero_update();
  }
  if (lora_down) {
    w_down.add_(lora_down->delta_weight().to(w_down.scalar_type()));
    lora_down->zero_update();
  }
}

bool ExpertsImpl::uses_grouped_mm(const torch::Tensor& x) const {
  if (!opt_.grouped_mm || !x.is_cuda()) return false;
  const bool bf16 = x.scalar_type() == torch::kBFloat16 ||
                    (at::autocast::is_autocast_enabled(at::kCUDA) &&
                     at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16);
  // _grouped_mm wants 16-byte-aligned rows (8 bf16): the adapters' rank too.
  const bool lora_aligned = opt_.lora_gate_up.r % 8 == 0 && opt_.lora_down.r % 8 == 0;
  return bf16 && opt_.hidden_size % 8 == 0 && opt_.ffn_size % 8 == 0 && lora_aligned &&
         experts_grouped_mm_supported(x.device());
}

bool ExpertsImpl::fuses_gate_up() const {
  // Each 4-bit stack is dequantized and multiplied on its own; offloaded stacks are read from the
  // ring by one GEMM each.
  if (gate_4bit || up_place_) return false;
  // The packed activations are plain SwiGLU's and GeGLU's, without biases.
  const auto act = opt_.activation;
  if (opt_.bias ||
      (act != config::ExpertActivation::kSwiglu && act != config::ExpertActivation::kGeglu)) {
    return false;  // clamped SwiGLU, relu2
  }
  // bf16 weights (training.param_dtype bf16, a frozen 16-bit base under LoRA) are read in place
  // by two GEMMs; one GEMM would need a concatenated copy kept for the backward: E d 2f bf16
  // per layer (38 GB over Qwen3-30B-A3B's 48 layers).
  return opt_.fused_gate_up && w_gate.scalar_type() != torch::kBFloat16;
}

bool experts_grouped_mm_supported(const torch::Device& device) {
  return device.is_cuda() &&
         at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->major == 9;
}

void ExpertsImpl::add_gate_up_update(torch::Tensor& gate, torch::Tensor& up,
                                     const torch::Tensor& delta) const {
  if (!gate.defined()) {  // relu2: the adapter is up's alone
    up = up + delta;
    return;
  }
  const auto halves = delta.chunk(2, 1);
  gate = gate + halves[0];
  up = up + halves[1];
}

torch::Tensor ExpertsImpl::activation(const torch::Tensor& gate, const torch::Tensor& up) const {
  if (opt_.activation == config::ExpertActivation::kRelu2) return torch::relu(up).square();
  if (opt_.activation == config::ExpertActivation::kClampedSwiglu) {
    return kernels::clamped_swiglu_activation(gate, up, opt_.swiglu_limit, opt_.swiglu_alpha,
                                              opt_.fused_swiglu);
  }
  if (opt_.activation == config::ExpertActivation::kGeglu)
    return kernels::geglu_activation(gate, up, opt_.fused_swiglu);
  return kernels::swiglu_activation(gate, up, opt_.fused_swiglu);
}

torch::Tensor ExpertsImpl::forward(const torch::Tensor& x, const torch::Tensor& tokens_per_expert) {
  if (uses_grouped_mm(x)) {
    // All experts in one grouped GEMM per projection; offsets (group ends) stay on the device.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto offs = tokens_per_expert.to(x.device()).cumsum(0).to(torch::kInt);
    const auto xb = x.to(torch::kBFloat16);
    // Each row's expert, for the biases (output_size: no host sync).
    torch::Tensor row_expert;
    if (b_gate.defined()) {
      row_expert = torch::repeat_interleave(
          torch::arange(opt_.num_experts, offs.options().dtype(torch::kLong)),
          tokens_per_expert.to(x.device()), 0, x.size(0));
    }
    const auto plus_bias = [&](const torch::Tensor& y, const torch::Tensor& b) {
      return b.defined() ? y + b.index_select(0, row_expert).to(y.scalar_type()) : y;
    };
    torch::Tensor h;
    if (fuses_gate_up()) {
      // One GEMM of N = 2f instead of two: x read once, and its backward is one input-gradient
      // GEMM over K = 2f rather than two whose results autograd then adds. The weights' bf16
      // copies (made and kept for the backward either way) are made side by side instead.
      const auto w = concat_bf16(w_gate, w_up);
      auto gate_up = at::_grouped_mm(xb, w, offs);
      // (x A) B through the same offsets (W + B A is never formed): already [gate | up].
      if (lora_gate_up) gate_up = gate_up + lora_gate_up->forward_grouped(xb, offs);
      h = opt_.activation == config::ExpertActivation::kGeglu
              ? kernels::geglu_packed_activation(gate_up, opt_.fused_swiglu)
              : kernels::swiglu_packed_activation(gate_up, opt_.fused_swiglu);
    } else {
      const bool gated = w_gate.defined() || gate_4bit;
      auto gate =
          gated ? plus_bias(grouped_projection(xb, w_gate, gate_4bit, gate_place_, offs), b_gate)
                : torch::Tensor();
      auto up = plus_bias(grouped_projection(xb, w_up, up_4bit, up_place_, offs), b_up);
      if (lora_gate_up) add_gate_up_update(gate, up, lora_gate_up->forward_grouped(xb, offs));
      h = activation(gate, up);
    }
    if (opt_.expert_dropout > 0) h = torch::dropout(h, opt_.expert_dropout, is_training());
    auto y = plus_bias(grouped_projection(h, w_down, down_4bit, down_place_, offs), b_down);
    if (lora_down) y = y + lora_down->forward_grouped(h, offs);
    return y;
  }
  // Per-expert GEMMs over contiguous segments; counts are needed on the host to slice.
  auto counts = tokens_per_expert.to(torch::kCPU);
  const int64_t* c = counts.data_ptr<int64_t>();
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(opt_.num_experts));
  // unbind, not w_gate[e]: the backward of E selects would build E zero-filled [E, d, f]
  // gradients and add them up; unbind's backward stacks the E slices into one.
  // (A 4-bit base's stacks are empty: nothing to unbind.)
  const auto unbound = [](const torch::Tensor& w) {
    return w.defined() && w.numel() > 0 ? w.unbind(0) : std::vector<torch::Tensor>{};
  };
  const auto gate = unbound(w_gate), up = unbound(w_up), down = unbound(w_down);
  const auto bias_gate = unbound(b_gate), bias_up = unbound(b_up), bias_down = unbound(b_down);
  const auto plus_bias = [](const torch::Tensor& y, const std::vector<torch::Tensor>& b,
                            int64_t e) {
    return b.empty() ? y : y + b[static_cast<size_t>(e)].to(y.scalar_type());
  };
  const auto gate_up_lora =
      lora_gate_up ? lora_gate_up->slices() : layers::ExpertLora::Impl::Slices{};
  const auto down_lora = lora_down ? lora_down->slices() : layers::ExpertLora::Impl::Slices{};
  // One split into the experts' segments, not a narrow per expert: each narrow's backward would
  // zero-fill a gradient the size of all of x, E of them summed; split's is one cat.
  const auto segments = x.split_with_sizes(c10::IntArrayRef(c, opt_.num_experts), 0);
  for (int64_t e = 0; e < opt_.num_experts; ++e) {
    if (c[e] == 0) continue;  // experts without tokens are normal
    const auto& seg = segments[static_cast<size_t>(e)];
    const bool gated = !gate.empty() || gate_4bit;  // relu2 experts have up and down only
    auto g = !gated ? torch::Tensor()
                    : plus_bias(gate_4bit ? layers::expert_linear_4bit(seg, gate_4bit, e)
                                          : expert_matmul(seg, gate, gate_place_, e),
                                bias_gate, e);
    auto u = plus_bias(up_4bit ? layers::expert_linear_4bit(seg, up_4bit, e)
                               : expert_matmul(seg, up, up_place_, e),
                       bias_up, e);
    if (lora_gate_up) add_gate_up_update(g, u, lora_gate_up->forward_expert(seg, gate_up_lora, e));
    auto h = activation(g, u);
    if (opt_.expert_dropout > 0) h = torch::dropout(h, opt_.expert_dropout, is_training());
    auto y = plus_bias(down_4bit ? layers::expert_linear_4bit(h, down_4bit, e)
                                 : expert_matmul(h, down, down_place_, e),
                       bias_down, e);
    if (lora_down) y = y + lora_down->forward_expert(h, down_lora, e);
    outs.push_back(y);
  }
  if (outs.empty()) return torch::zeros_like(x);
  return torch::cat(outs, 0);
}

}  // namespace moe::moe
