#include "moe/moe/moe_layer.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "moe/config/parallel_dims.h"
#include "moe/layers/profile_scope.h"

namespace moe::moe {

namespace {
RouterOptions router_options(const MoeLayerOptions& opt) {
  RouterOptions r = opt.router;
  r.fused_kernel = opt.kernel_path == KernelPath::kCuda;
  return r;
}
}  // namespace

MoeLayerImpl::MoeLayerImpl(const MoeLayerOptions& opt)
    : opt_(opt), dispatcher_(opt.kernel_path, opt.router.num_experts, opt.router.top_k) {
  router = register_module("router", Router(router_options(opt)));
  ExpertsOptions routed = opt.experts;
  if (opt.ep.size > 1) {
    TORCH_CHECK(routed.lora_gate_up.r == 0 && routed.lora_down.r == 0,
                "LoRA on expert-parallel experts is not supported");
    const config::ExpertRange held =
        config::expert_range(routed.num_experts, opt.ep.size, opt.ep.rank);
    routed.local_experts = held.count;
    routed.first_expert = held.first;
  }
  if (opt.latent_size > 0) routed.hidden_size = opt.latent_size;
  experts = register_module("experts", Experts(routed));
  if (opt.shared_expert_hidden_size > 0) {
    ExpertsOptions shared = opt.experts;
    shared.num_experts = 1;
    shared.ffn_size = opt.shared_expert_hidden_size;
    shared.lora_gate_up = shared.lora_down = {};  // LoRA adapts the routed experts only
    // The routed experts' biases and activation are gpt-oss's; shared experts (DeepSeekMoE)
    // are plain SwiGLU MLPs.
    shared.bias = false;
    const auto routed_act = opt.experts.activation;
    shared.activation = routed_act == config::ExpertActivation::kGeglu ||
                                routed_act == config::ExpertActivation::kRelu2
                            ? routed_act  // Gemma 4's GeGLU, Nemotron-H's relu2 MLPs everywhere
                            : config::ExpertActivation::kSwiglu;
    shared_expert = register_module("shared_expert", Experts(shared));
    if (opt.shared_expert_gate) {
      shared_expert_gate = register_module(
          "shared_expert_gate",
          torch::nn::Linear(torch::nn::LinearOptions(opt.experts.hidden_size, 1).bias(false)));
      if (opt.shared_expert_gate_lora.r > 0) {
        lora_shared_expert_gate = register_module(
            "lora_shared_expert_gate",
            layers::LoraAdapter(opt.experts.hidden_size, 1, opt.shared_expert_gate_lora));
      }
      torch::NoGradGuard no_grad;
      shared_expert_gate->weight.normal_(0.0, opt.experts.init_std);
    }
  }
  if (opt.latent_size > 0) {
    const int64_t d = opt.experts.hidden_size, l = opt.latent_size;
    latent_in =
        register_module("latent_in", torch::nn::Linear(torch::nn::LinearOptions(d, l).bias(false)));
    latent_out = register_module("latent_out",
                                 torch::nn::Linear(torch::nn::LinearOptions(l, d).bias(false)));
    torch::NoGradGuard no_grad;
    latent_in->weight.normal_(0.0, opt.experts.init_std);
    latent_out->weight.normal_(0.0, opt.experts.output_init_std);  // writes into the residual
  }
}

torch::Tensor MoeLayerImpl::dispatch_rows(const torch::Tensor& x) const {
  if (!opt_.dispatch_in_compute_dtype || x.scalar_type() != torch::kFloat) return x;
  const auto device = x.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return x;
  // The experts' GEMMs would cast each of the k copies of a row to this dtype: casting the T rows
  // once gives them the same values, and the permute and the exchange move half the bytes.
  return x.to(at::autocast::get_autocast_dtype(device));
}

MoeLayerOutput MoeLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& router_input) {
  const int64_t T = x.size(0);
  // Scopes: the flops profiler's module kinds (moe/layers/profile_scope.h; off otherwise).
  Routing r;
  {
    layers::profile::Scope scope("router");
    r = router->forward(router_input);
  }
  DispatchPlan plan;
  torch::Tensor permuted, y, expert_in = x;
  if (latent_in) {  // LatentMoE: the routed experts' rows at the latent width
    layers::profile::Scope scope("experts");
    expert_in = latent_in->forward(x);
  }
  {
    layers::profile::Scope scope("dispatch");
    plan = dispatcher_.plan(r.topk_idx, r.keep, r.all_kept, r.tokens_per_expert);
    permuted = dispatcher_.permute(dispatch_rows(expert_in), plan);
  }
  {
    layers::profile::Scope scope("experts");
    if (opt_.ep.size > 1) {  // to the experts' ranks and back (expert_parallel.h)
      y = experts_across_ranks(permuted, plan.tokens_per_expert, opt_.ep,
                               [this](const torch::Tensor& rows, const torch::Tensor& counts) {
                                 return experts->forward(rows, counts);
                               });
    } else {
      y = experts->forward(permuted, plan.tokens_per_expert);
    }
  }
  MoeLayerOutput out;
  {
    layers::profile::Scope scope("combine");
    out.y = dispatcher_.combine(y, plan, r.topk_weight, T);
  }
  if (latent_out) {  // back to the hidden width
    layers::profile::Scope scope("experts");
    out.y = latent_out->forward(out.y);
  }
  if (shared_expert) {
    layers::profile::Scope scope("experts");
    auto shared = shared_expert->forward(x, torch::full({1}, T, x.options().dtype(torch::kLong)));
    if (shared_expert_gate) {
      auto gate = shared_expert_gate->forward(x);
      if (lora_shared_expert_gate) gate = gate + lora_shared_expert_gate->forward(x);
      shared = torch::sigmoid(gate) * shared;
    }
    out.y = out.y + shared;
  }
  out.aux_loss = r.aux_loss;
  out.z_loss = r.z_loss;
  out.tokens_per_expert = r.tokens_per_expert;
  out.dropped = r.dropped;
  return out;
}

void MoeLayerImpl::merge_lora() {
  experts->merge_lora();
  if (!lora_shared_expert_gate) return;
  torch::NoGradGuard no_grad;
  auto& w = shared_expert_gate->weight;
  w.add_(lora_shared_expert_gate->delta_weight().to(w.scalar_type()));
  lora_shared_expert_gate->zero_update();
}

}  // namespace moe::moe
