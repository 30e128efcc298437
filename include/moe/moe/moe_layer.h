// The MoE FFN: route -> dispatch -> experts -> combine (Megatron-Core's moe_layer order; the
// dispatcher is chosen once, in the constructor). Reports per-expert load and losses.
#pragma once

#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "moe/layers/lora.h"
#include "moe/moe/dispatcher.h"
#include "moe/moe/expert_parallel.h"
#include "moe/moe/experts.h"
#include "moe/moe/router.h"

namespace moe::moe {

struct MoeLayerOptions {
  RouterOptions router;
  ExpertsOptions experts;
  // Our CUDA kernels (router, dispatch plan, permute, combine) or the ATen reference: settled
  // when the model is built for its device (resolve_kernel_path), never per call.
  KernelPath kernel_path = KernelPath::kReference;
  int64_t shared_expert_hidden_size = 0;     // > 0: a dense SwiGLU expert for every token
  bool shared_expert_gate = false;           // its output times sigmoid(x . shared_expert_gate)
  layers::LoraSpec shared_expert_gate_lora;  // r > 0: an adapter on that gate
  // > 0: the routed experts read and write this width (LatentMoE, Nemotron 3 Super): latent_in
  // before the dispatch, latent_out after the combine; router and shared expert read x.
  int64_t latent_size = 0;
  // moe.dispatch_dtype = compute: under autocast, fp32 rows are cast to its dtype before the
  // dispatch (permute, the EP exchange), not by the experts after it.
  bool dispatch_in_compute_dtype = false;
  // Expert parallelism: the routed experts spread over an EP group (expert_parallel.h).
  ExpertParallel ep;
};

// What the MoE layers need from the ranks they train with (train::DataParallel builds it): how
// the routers combine loads over the data-parallel ranks, and the EP group of the experts.
struct MoeParallel {
  LoadReduction loads;
  ExpertParallel ep;
};

struct MoeLayerOutput {
  torch::Tensor y;                  // [T, d]
  torch::Tensor aux_loss;           // scalar fp32
  torch::Tensor z_loss;             // scalar fp32
  torch::Tensor tokens_per_expert;  // [E] int64
  int64_t dropped = 0;
};

class MoeLayerImpl : public torch::nn::Module {
 public:
  explicit MoeLayerImpl(const MoeLayerOptions& opt);
  MoeLayerOutput forward(const torch::Tensor& x) { return forward(x, x); }  // x [T, d]
  // The router reading `router_input` [T, d] (Gemma 4: the residual, with its own norm), the
  // experts and the shared expert `x`.
  MoeLayerOutput forward(const torch::Tensor& x, const torch::Tensor& router_input);
  // After an optimizer step that updated the weights: the router's expert bias follows the
  // step's load (tokens per expert [E], all micro-batches).
  void after_optimizer_step(const torch::Tensor& tokens_per_expert) {
    router->update_expert_bias(tokens_per_expert);
  }

  Router router{nullptr};
  Experts experts{nullptr};
  // The shared expert (DeepSeekMoE): one SwiGLU MLP held as a single-expert stack [1, ...], so it
  // reuses the experts' code and init. Null when shared_expert_hidden_size is 0.
  Experts shared_expert{nullptr};
  // d -> 1 (Qwen2-MoE, Qwen3-Next, Qwen3.5): the shared expert's output times sigmoid(gate(x)).
  torch::nn::Linear shared_expert_gate{nullptr};
  layers::LoraAdapter lora_shared_expert_gate{nullptr};  // its adapter (PEFT: shared_expert_gate)
  void merge_lora();  // the experts' adapters and the gate's folded into their weights
  // d -> latent_size and back, without bias (Nemotron 3 Super's fc1/fc2_latent_proj). Null
  // without moe.latent_size.
  torch::nn::Linear latent_in{nullptr}, latent_out{nullptr};

 private:
  torch::Tensor dispatch_rows(const torch::Tensor& x) const;  // x, or x in the compute dtype
  MoeLayerOptions opt_;
  Dispatcher dispatcher_;
};
TORCH_MODULE(MoeLayer);

}  // namespace moe::moe
