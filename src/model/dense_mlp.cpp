#include "moe/model/dense_mlp.h"

#include <torch/torch.h>

#include "moe/kernels/swiglu.h"
#include "moe/layers/profile_scope.h"
#include "moe/model/block.h"
#include "moe/model/block_parts.h"

namespace moe::model {

DenseMlpImpl::DenseMlpImpl(int64_t hidden, int64_t ffn, double init_std, double out_init_std,
                           const layers::LoraSpec& lora, const config::LoraTargets& targets,
                           bool gated)
    : relu2(!gated) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  if (gated) gate_proj = register_module("gate_proj", linear(hidden, ffn));
  up_proj = register_module("up_proj", linear(hidden, ffn));
  down_proj = register_module("down_proj", linear(ffn, hidden));
  {
    torch::NoGradGuard g;
    if (gated) gate_proj->weight.normal_(0.0, init_std);
    up_proj->weight.normal_(0.0, init_std);
    down_proj->weight.normal_(0.0, out_init_std);
  }
  if (lora.r == 0) return;
  if (!targets.dense_mlp) return;
  if (gated) lora_gate = register_module("lora_gate", layers::LoraAdapter(hidden, ffn, lora));
  lora_up = register_module("lora_up", layers::LoraAdapter(hidden, ffn, lora));
  lora_down = register_module("lora_down", layers::LoraAdapter(ffn, hidden, lora));
}

torch::Tensor DenseMlpImpl::forward(const torch::Tensor& x) {
  auto project = [](torch::nn::Linear& base, const layers::QuantizedWeightPtr& q,
                    layers::LoraAdapter& a, const torch::Tensor& in) {
    const auto y = q ? layers::linear_4bit(in, q) : base->forward(in);
    return a ? y + a->forward(in) : y;
  };
  const auto up = project(up_proj, up_4bit, lora_up, x);
  if (relu2) return project(down_proj, down_4bit, lora_down, torch::relu(up).square());
  const auto gate = project(gate_proj, gate_4bit, lora_gate, x);
  const auto h = geglu ? kernels::geglu_activation(gate, up, fused_swiglu)
                       : kernels::swiglu_activation(gate, up, fused_swiglu);
  return project(down_proj, down_4bit, lora_down, h);
}

void DenseMlpImpl::merge_lora() {
  torch::NoGradGuard g;
  for (auto [a, base] : {std::pair{lora_gate, gate_proj}, std::pair{lora_up, up_proj},
                         std::pair{lora_down, down_proj}}) {
    if (!a || !base) continue;
    base->weight.add_(a->delta_weight().to(base->weight.scalar_type()));
    a->zero_update();
  }
}

namespace {

// The dense kind behind the feed-forward interface: no routing, so no MoE statistics.
class DenseFeedForward final : public FeedForward {
 public:
  explicit DenseFeedForward(DenseMlp mlp) : mlp_(std::move(mlp)) {}
  moe::MoeLayerOutput forward(const torch::Tensor& x) override {
    layers::profile::Scope scope("dense_ffn");
    return no_routing(mlp_->forward(x));
  }
  void merge_lora() override { mlp_->merge_lora(); }

 private:
  DenseMlp mlp_;
};

}  // namespace

std::shared_ptr<FeedForward> dense_feed_forward(BlockImpl& block, const BlockContext& ctx) {
  const auto& cfg = ctx.cfg;
  block.mlp = block.register_module(
      "mlp", DenseMlp(cfg.model.hidden_size, config::dense_hidden_size(cfg), cfg.model.init_std,
                      output_init_std(cfg), lora_spec(cfg), config::lora_targets(cfg.lora),
                      config::gated_mlp(cfg)));
  block.mlp->fused_swiglu = fused_block_kernels(ctx);
  block.mlp->geglu = cfg.moe.activation == config::ExpertActivation::kGeglu;
  return std::make_shared<DenseFeedForward>(block.mlp);
}

}  // namespace moe::model
