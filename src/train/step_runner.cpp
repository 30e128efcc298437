#include "moe/train/step_runner.h"

#include "moe/parallel/data_parallel.h"

#include <ATen/autocast_mode.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "moe/layers/profile_scope.h"
#include "moe/train/chunked_lm_loss.h"
#include "moe/train/cuda_graph_step.h"
#include "moe/train/loss_targets.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"

namespace moe::train {

using parallel::Clipping;

MicroLosses compute_losses(model::TransformerLM& model, const torch::Tensor& batch,
                           const config::Config& cfg) {
  layers::profile::ForwardPhase phase;  // the flops profiler times forward passes only
  const LossTargets targets = loss_targets(batch, cfg);
  const int64_t chunk = cfg.training.head_chunk_tokens;
  model::LmOutput out;
  MicroLosses l;
  {
    model::BaseDtypeAutocast autocast(model);  // 16-bit matrices: autocast on their device
    out = model->forward(targets.inputs, /*logits=*/chunk == 0);
    if (chunk > 0) {
      // The chunked head computes its gradients here too: the flops profiler's "head" scope
      // (forward passes only) then also holds the head's backward matmuls.
      layers::profile::Scope scope("head");
      const auto hidden = out.hidden.reshape({-1, out.hidden.size(-1)});
      l.lm = chunked_lm_loss(hidden, model->head_weight(), targets, chunk, model->logit_softcap());
    }
  }
  if (chunk == 0) {
    layers::profile::Scope scope("head");  // the loss belongs to the head
    const auto logits = out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat);
    l.lm = masked_lm_loss(logits, targets);
  }
  l.targets = targets.count;
  l.aux = out.aux_loss;
  l.z = out.z_loss;
  l.total = l.lm + cfg.moe.aux_loss_coeff * l.aux + cfg.moe.z_loss_coeff * l.z;
  l.tokens_per_expert = std::move(out.tokens_per_expert);
  l.dropped = out.dropped;
  return l;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kGraphWarmupSteps = 3;  // eager steps before the CUDA graph is captured

// Test hook (tests/train/faults_test.py, util/fault_injection.h): a NaN in one parameter's
// gradient, or a NaN loss (and gradients), at the listed steps.
void inject_nan_for_tests(model::TransformerLM& model, int64_t step, double& loss_sum) {
  const FaultInjection& f = fault_injection();
  if (f.nan_steps.empty() || !f.nan_at(step)) return;
  if (f.nan_in_loss) {
    loss_sum = std::nan("");
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().fill_(std::nan(""));
    }
    return;
  }
  for (auto& item : model->named_parameters()) {
    if (item.key() == f.nan_in_gradient_of && item.value().grad().defined()) {
      item.value().mutable_grad().view(-1)[0] = std::nan("");
    }
  }
}

// The first parameter (in module order) whose gradient holds a NaN or Inf.
std::string first_non_finite_gradient(model::TransformerLM& model) {
  for (const auto& item : model->named_parameters()) {
    const auto& g = item.value().grad();
    if (g.defined() && !g.isfinite().all().item<bool>()) return item.key();
  }
  return "(none: the loss itself)";
}

// A micro-batch's loss figures (lm, aux, z, target tokens) as one device tensor: read on the
// host once per step (add_loss_figures), not with a sync per figure and micro-batch.
torch::Tensor loss_figures(const MicroLosses& l) {
  const auto d = l.lm.device();
  return torch::stack({l.lm.detach().reshape({}).to(d, torch::kDouble),
                       l.aux.detach().reshape({}).to(d, torch::kDouble),
                       l.z.detach().reshape({}).to(d, torch::kDouble),
                       l.targets.detach().reshape({}).to(d, torch::kDouble)});
}

// One transfer, then the sums in micro-batch order as the host always added them.
void add_loss_figures(const std::vector<torch::Tensor>& figures, StepResult& r) {
  if (figures.empty()) return;
  const torch::Tensor host = torch::stack(figures).to(torch::kCPU).contiguous();
  const double* v = host.data_ptr<double>();
  for (size_t m = 0; m < figures.size(); ++m, v += 4) {
    r.lm_sum += v[0];
    r.aux_sum += v[1];
    r.z_sum += v[2];
    r.target_tokens += static_cast<int64_t>(static_cast<float>(v[3]));
  }
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class EagerStepRunner : public StepRunner {
 public:
  EagerStepRunner(model::TransformerLM& model, const config::Config& cfg,
                  optim::FusedAdamW& optimizer, optim::LossScaler& scaler,
                  const StepRunnerOptions& opt)
      : model_(model), cfg_(cfg), optimizer_(optimizer), scaler_(scaler), opt_(opt) {}

  StepResult run(int64_t step, double /*lr*/, const NextBatch& next) override {
    StepResult r;
    const bool autocast = opt_.bf16 || opt_.fp16;
    DataParallel& dp = *opt_.dp;
    dp.begin_step(model_, optimizer_);
    // Offload with streaming: gradients reach the host during the backward, and unscaling,
    // the norm and clipping run on those host copies
    // (optim::FusedAdamW::stream_gradients_in_backward).
    const bool streamed = optimizer_.streams_gradients();
    std::vector<torch::Tensor> figures;  // per micro-batch, on the device until the step's end
    for (int64_t micro = 0; micro < opt_.micro_batches; ++micro) {
      auto batch = next();
      if (autocast) {
        at::autocast::set_autocast_enabled(at::kCUDA, true);
        at::autocast::set_autocast_dtype(at::kCUDA, opt_.bf16 ? at::kBFloat16 : at::kHalf);
      }
      auto tf = Clock::now();
      MicroLosses l = compute_losses(model_, batch, cfg_);
      if (autocast) at::autocast::set_autocast_enabled(at::kCUDA, false);
      sync();
      auto tb = Clock::now();
      // Only fp16 scales the loss; bf16 and fp32 gradients need no scaling.
      const double scale = opt_.fp16 ? scaler_.scale() : 1.0;
      optimizer_.begin_backward(micro + 1 == opt_.micro_batches);
      dp.backward(l.total * (scale / static_cast<double>(opt_.micro_batches)),
                  micro + 1 == opt_.micro_batches);
      // 16-bit gradients are summed over micro-batches in fp32 (and widened before fp16's
      // unscaling, which would flush small ones to zero in fp16).
      if (!streamed && (opt_.micro_batches > 1 || opt_.fp16)) {
        optimizer_.accumulate_micro_batch(micro + 1 == opt_.micro_batches);
      }
      sync();
      r.forward_s += std::chrono::duration<double>(tb - tf).count();
      r.backward_s += seconds_since(tb);
      figures.push_back(loss_figures(l));
      r.dropped += l.dropped;
      accumulate_loads(r.tokens_per_expert, l.tokens_per_expert);
    }
    if (autocast) at::autocast::clear_cache();
    add_loss_figures(figures, r);
    dp.finish_gradients(model_, r);
    auto grads = streamed ? streamed_grads() : defined_grads(model_->parameters());
    const torch::Device where = streamed ? torch::Device(torch::kCPU) : device();
    if (opt_.fp16) {  // unscale in place and detect overflow in one pass
      auto found_inf = torch::zeros({1}, torch::TensorOptions().device(where));
      auto inv_scale =
          torch::full({1}, 1.0 / scaler_.scale(), torch::TensorOptions().device(where));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
      dp.agree_on_overflow(found_inf);
      r.overflow = found_inf.item<float>() > 0;
    }
    inject_nan_for_tests(model_, step + 1, r.lm_sum);
    grad_divisor_ = torch::Tensor();
    if (r.overflow) {
      r.grad_norm = std::nan("");
    } else {
      const Clipping c = dp.clip(grads, opt_.max_norm);
      r.grad_norm = c.norm;
      grad_divisor_ = c.grad_divisor;
    }
    return r;
  }

  void update(double lr) override {
    // Clipping folded into the update (DataParallel::clip): the fused AdamW divides by it.
    if (grad_divisor_.defined()) {
      optimizer_.step(lr, grad_divisor_);
    } else {
      optimizer_.step(lr);
    }
    grad_divisor_ = torch::Tensor();
    opt_.dp->after_update();
  }

 private:
  void sync() {
    if (opt_.sync_for_timing) torch::cuda::synchronize();
  }
  torch::Device device() { return model_->parameters().front().device(); }
  // The host copies, in the model's parameter order as defined_grads (the norm sums in order).
  std::vector<torch::Tensor> streamed_grads() {
    optimizer_.finish_streamed_gradients();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model_->parameters()) {
      if (auto g = optimizer_.streamed_gradient(p); g.defined()) grads.push_back(std::move(g));
    }
    return grads;
  }

  model::TransformerLM& model_;
  const config::Config& cfg_;
  optim::FusedAdamW& optimizer_;
  optim::LossScaler& scaler_;
  StepRunnerOptions opt_;
  torch::Tensor grad_divisor_;  // this step's clipping, for update()
};

// training.cuda_graph: eager warm-up steps first (allocator, cuBLAS, autograd settle), then one
// capture; every later step is a replay. A failed capture leaves the run eager.
class GraphStepRunner : public StepRunner {
 public:
  GraphStepRunner(model::TransformerLM& model, const config::Config& cfg,
                  optim::FusedAdamW& optimizer, optim::LossScaler& scaler,
                  const StepRunnerOptions& opt, const torch::Device& device, int64_t first_step,
                  spdlog::logger& log)
      : eager_(model, cfg, optimizer, scaler, opt), cfg_(cfg), first_step_(first_step), log_(log) {
    auto micro_forward = [&model, &cfg](const torch::Tensor& tokens) {
      struct Bf16Autocast {  // switched off again even when the forward throws mid-capture
        Bf16Autocast() {
          at::autocast::set_autocast_enabled(at::kCUDA, true);
          at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
        }
        ~Bf16Autocast() { at::autocast::set_autocast_enabled(at::kCUDA, false); }
      } autocast;
      return compute_losses(model, tokens, cfg);
    };
    graph_ = std::make_unique<CudaGraphStep>(
        model->parameters(), optimizer, micro_forward, opt.micro_batches,
        std::vector<int64_t>{cfg.train_micro_batch_size_per_gpu, cfg.model.seq_len + 1},
        opt.max_norm, device);
  }

  StepResult run(int64_t step, double lr, const NextBatch& next) override {
    graphed_ = false;
    if (!graph_ || step - first_step_ < kGraphWarmupSteps) return eager_.run(step, lr, next);
    // A replay needs every micro-batch first; they are kept for an eager fallback.
    std::vector<torch::Tensor> batches;
    for (size_t micro = 0; micro < static_cast<size_t>(graph_inputs()); ++micro) {
      batches.push_back(next());
      graph_->set_input(static_cast<int64_t>(micro), batches.back());
    }
    if (!captured_) {
      std::string why;
      captured_ = graph_->capture(why);
      at::autocast::clear_cache();
      if (captured_) {
        log_.info("training.cuda_graph: step {} captured; replaying from here on", step + 1);
      } else {
        log_.warn("training.cuda_graph: capture failed ({}); training continues eagerly", why);
        graph_.reset();
        size_t i = 0;
        return eager_.run(step, lr, [&] { return batches.at(i++); });
      }
    }
    graph_->replay(lr);
    at::autocast::clear_cache();
    graphed_ = true;
    StepResult r;
    r.graphed = true;
    r.lm_sum = graph_->lm_sum.item<double>();
    r.aux_sum = graph_->aux_sum.item<double>();
    r.z_sum = graph_->z_sum.item<double>();
    r.tokens_per_expert = graph_->tokens_per_expert;
    r.grad_norm = graph_->grad_norm.item<double>();  // clipped (and updated or skipped) inside
    for (const auto& b : batches) {
      r.target_tokens += static_cast<int64_t>(loss_targets(b, cfg_).count.item<float>());
    }
    return r;
  }

  void update(double lr) override {
    if (!graphed_) eager_.update(lr);
  }

 private:
  int64_t graph_inputs() const { return graph_->micro_batches(); }

  EagerStepRunner eager_;
  const config::Config& cfg_;
  std::unique_ptr<CudaGraphStep> graph_;
  bool captured_ = false, graphed_ = false;
  int64_t first_step_;
  spdlog::logger& log_;
};

}  // namespace

std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

void accumulate_loads(std::vector<torch::Tensor>& acc, const std::vector<torch::Tensor>& add) {
  if (acc.empty()) {
    acc = add;
    return;
  }
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + add[i];
}

bool NonFiniteGuard::skip(const StepResult& r, double loss, int64_t step,
                          model::TransformerLM& model,
                          const std::function<std::vector<std::string>()>& checkpoints) {
  if (std::isfinite(r.grad_norm) && std::isfinite(loss)) {
    consecutive_ = 0;
    return false;
  }
  const std::string what = std::isfinite(loss) ? "gradients" : "loss";
  const std::string where = first_non_finite_gradient(model);
  const std::vector<std::string> ckpts = checkpoints();
  if (++consecutive_ >= max_) {
    throw TrainingError("non-finite " + what + " at step " + std::to_string(step) + " (" +
                        std::to_string(consecutive_) +
                        " bad steps in a row, training.max_bad_steps = " + std::to_string(max_) +
                        "); first non-finite gradients in " + where +
                        "; last good checkpoint: " + (ckpts.empty() ? "none" : ckpts.front()));
  }
  log_.warn("step {}: non-finite {} (first in {}); update skipped ({} of {} allowed in a row)",
            step, what, where, consecutive_, max_ - 1);
  return true;
}

std::unique_ptr<StepRunner> make_step_runner(model::TransformerLM& model, const config::Config& cfg,
                                             optim::FusedAdamW& optimizer,
                                             optim::LossScaler& scaler,
                                             const StepRunnerOptions& opt,
                                             const torch::Device& device, int64_t first_step,
                                             spdlog::logger& log) {
  // training.cuda_graph: the whole step as one CUDA graph when this run allows it
  // (include/moe/train/cuda_graph_step.h lists the conditions).
  if (cfg.training.cuda_graph && opt.dp->size() > 1) {
    log.warn("training.cuda_graph: not used with data parallelism yet; training runs eagerly");
  } else if (cfg.training.cuda_graph) {
    const std::string why = cuda_graph_ineligible_reason(cfg, device);
    if (why.empty()) {
      return std::make_unique<GraphStepRunner>(model, cfg, optimizer, scaler, opt, device,
                                               first_step, log);
    }
    log.warn("training.cuda_graph: not used because {}; training runs eagerly", why);
  }
  return std::make_unique<EagerStepRunner>(model, cfg, optimizer, scaler, opt);
}

}  // namespace moe::train
