// The parallel dense + MoE feed-forward kind (moe.parallel_dense; Gemma 4's MoE block): a dense
// MLP and the routed experts read the same residual, each through its own pre-norm, and each
// output passes its own post-norm before the two are added. The router reads the residual
// itself (Gemma 4's router normalises it on its own, moe.router_input_norm).
#include <torch/torch.h>

#include "moe/model/block.h"
#include "moe/model/block_parts.h"

namespace moe::model {

namespace {

class ParallelFeedForward final : public FeedForward {
 public:
  ParallelFeedForward(const BlockImpl& block, std::shared_ptr<FeedForward> dense)
      : dense_(std::move(dense)),
        moe_(block.moe),
        mlp_norm_(block.mlp_norm),
        mlp_post_norm_(block.mlp_post_norm),
        moe_norm_(block.moe_norm),
        moe_post_norm_(block.moe_post_norm) {}
  bool takes_residual() const override { return true; }
  moe::MoeLayerOutput forward(const torch::Tensor& residual) override {
    const auto dense = mlp_post_norm_->forward(dense_->forward(mlp_norm_->forward(residual)).y);
    moe::MoeLayerOutput o = moe_->forward(moe_norm_->forward(residual), residual);
    o.y = dense + moe_post_norm_->forward(o.y);
    return o;
  }
  void merge_lora() override {
    dense_->merge_lora();
    moe_->experts->merge_lora();
  }

 private:
  std::shared_ptr<FeedForward> dense_;
  moe::MoeLayer moe_;
  RMSNorm mlp_norm_, mlp_post_norm_, moe_norm_, moe_post_norm_;
};

}  // namespace

std::shared_ptr<FeedForward> parallel_feed_forward(BlockImpl& block, const BlockContext& ctx) {
  // Registration order is parameter order: the dense branch, then the experts.
  block.mlp_norm = block.register_module("mlp_norm", hidden_norm(ctx.cfg));
  auto dense = dense_feed_forward(block, ctx);
  block.mlp_post_norm = block.register_module("mlp_post_norm", hidden_norm(ctx.cfg));
  moe_feed_forward(block, ctx);  // registers block.moe
  block.moe_post_norm = block.register_module("moe_post_norm", hidden_norm(ctx.cfg));
  return std::make_shared<ParallelFeedForward>(block, std::move(dense));
}

}  // namespace moe::model
