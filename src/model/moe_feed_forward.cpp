#include "moe/model/moe_feed_forward.h"

#include <torch/torch.h>

#include "moe/model/block.h"
#include "moe/model/block_parts.h"

namespace moe::model {

moe::MoeLayerOptions moe_options(const config::Config& cfg, const torch::Device& device,
                                 const moe::MoeParallel& parallel) {
  const auto& m = cfg.model;
  moe::MoeLayerOptions o;
  o.router.hidden_size = m.hidden_size;
  o.router.num_experts = cfg.moe.num_experts;
  o.router.top_k = cfg.moe.top_k;
  o.router.score_function = cfg.moe.score_function;
  o.router.normalize_topk = cfg.moe.normalize_topk;
  o.router.capacity_factor = cfg.moe.capacity_factor;
  o.router.router_bias_update_rate = cfg.moe.router_bias_update_rate;
  o.router.bias = cfg.moe.router_bias;
  o.router.softmax_after_topk = cfg.moe.softmax_after_topk;
  o.router.n_group = cfg.moe.n_group;
  o.router.topk_group = cfg.moe.topk_group;
  o.router.group_score_experts = cfg.moe.group_score_experts;
  o.router.routed_scaling_factor = cfg.moe.routed_scaling_factor;
  o.router.input_norm = cfg.moe.router_input_norm;
  o.router.per_expert_scale = cfg.moe.per_expert_scale;
  o.router.norm_eps = m.norm_eps;
  o.experts.bias = cfg.moe.expert_bias;
  o.experts.activation = cfg.moe.activation;
  o.experts.swiglu_limit = cfg.moe.swiglu_limit;
  o.experts.swiglu_alpha = cfg.moe.swiglu_alpha;
  o.router.load_reduction = parallel.loads;
  o.ep = parallel.ep;
  o.shared_expert_hidden_size = cfg.moe.shared_expert_hidden_size;
  o.shared_expert_gate = cfg.moe.shared_expert_gate;
  o.latent_size = cfg.moe.latent_size;
  o.dispatch_in_compute_dtype = cfg.moe.dispatch_dtype == config::DispatchDtype::kCompute;
  o.experts.num_experts = cfg.moe.num_experts;
  o.experts.hidden_size = m.hidden_size;
  o.experts.ffn_size = config::expert_hidden_size(cfg);
  o.experts.expert_dropout = cfg.moe.expert_dropout;
  o.experts.init_std = m.init_std;
  o.experts.output_init_std = output_init_std(cfg);
  o.kernel_path = moe::resolve_kernel_path(cfg.moe.kernels, device.is_cuda());
  o.experts.fused_swiglu = o.kernel_path == moe::KernelPath::kCuda;
  o.experts.fused_gate_up = cfg.moe.fused_gate_up;
  if (config::lora_enabled(cfg)) {
    const config::LoraTargets t = config::lora_targets(cfg.lora);
    if (!config::gated_mlp(cfg)) {  // relu2 experts: an adapter on up alone, rank r
      if (t.experts_up) o.experts.lora_gate_up = lora_spec(cfg);
    } else if (t.experts_gate_up_rank > 0) {  // its own rank and alpha (config/lora.h)
      o.experts.lora_gate_up = {t.experts_gate_up_rank,
                                config::lora_scaling(t.experts_gate_up_alpha,
                                                     t.experts_gate_up_rank, cfg.lora.use_rslora),
                                cfg.lora.lora_dropout};
    }
    if (t.experts_down) o.experts.lora_down = lora_spec(cfg);
    if (t.shared_expert_gate) o.shared_expert_gate_lora = lora_spec(cfg);
  }
  return o;
}

namespace {

// The MoE kind behind the feed-forward interface: route -> dispatch -> experts -> combine.
class MoeFeedForward final : public FeedForward {
 public:
  explicit MoeFeedForward(moe::MoeLayer layer) : layer_(std::move(layer)) {}
  moe::MoeLayerOutput forward(const torch::Tensor& x) override { return layer_->forward(x); }
  void merge_lora() override { layer_->merge_lora(); }

 private:
  moe::MoeLayer layer_;
};

}  // namespace

std::shared_ptr<FeedForward> moe_feed_forward(BlockImpl& block, const BlockContext& ctx) {
  block.moe =
      block.register_module("moe", moe::MoeLayer(moe_options(ctx.cfg, ctx.device, ctx.parallel)));
  return std::make_shared<MoeFeedForward>(block.moe);
}

}  // namespace moe::model
