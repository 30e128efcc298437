// AdamW as one fused multi-tensor update per parameter group (at::_fused_adamw_, which LibTorch
// implements for CPU (vectorised, at::parallel_for) and CUDA), the same math as
// torch.optim.AdamW(fused=True). Optional grad_scale / found_inf make fp16 unscaling and overflow
// skipping part of the same kernel. State (exp_avg, exp_avg_sq, step) is addressable by
// parameter name for checkpoints.
//
// Offload (DeepSpeed's zero_optimization.offload_optimizer.device = "cpu"): the fp32 master
// weights and the Adam state live in host memory (masters and gradient staging pinned, in one
// buffer per dtype: host_arena.h) and the update runs on the CPU. Each
// step copies the gradients to the host in buckets on a side CUDA stream, updates bucket b on the
// CPU while bucket b+1 is still in flight, and copies each updated bucket back as soon as it is
// done, so copies in both directions overlap the CPU update. The device keeps only the working
// weights and their gradients: 8 of the 16 bytes per parameter that fp32 AdamW needs on the GPU.
//
// Moment precision (optimizer.exp_avg_dtype / exp_avg_sq_dtype): fp32 moments take the fused
// kernel above. bf16 or 8-bit moments take the reference update, ATen ops per parameter on the
// parameter's device (or the host master under offload): the moments are read into fp32, the
// AdamW step is taken in fp32 exactly as bitsandbytes' CPU Adam writes it, and the moments are
// stored back rounded to bf16 or quantised blockwise (blockwise_quant.h). 8-bit applies to
// parameters of >= 4096 values; smaller ones keep fp32 moments, as bitsandbytes does.
//
// 16-bit working weights (training.param_dtype bf16/fp16): a parameter held in 16 bits gets an
// fp32 master here (on its device, or on the host under offload); the update reads its gradient
// in fp32 (a 16-bit gradient is widened one bucket at a time), steps the master, and rounds it
// back into the weight. With optimizer.main_params_dtype = bf16 there is no master: the bf16
// weight is stepped through an fp32 view and the rounding error is carried in a bf16 Kahan
// compensation buffer (docs/memory.md says why Kahan and not stochastic rounding).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/types.h>

#include "moe/config/choices.h"
#include "moe/optim/host_arena.h"

namespace moe::optim {

class OffloadGradientStream;

struct AdamWGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
};

struct AdamWState {                         // of one parameter
  torch::Tensor exp_avg, exp_avg_sq, step;  // step: fp32 scalar, as PyTorch keeps it
  // 8-bit moments: exp_avg / exp_avg_sq hold uint8 codes and these one fp32 absmax per 256
  // values; undefined for fp32 and bf16 moments.
  torch::Tensor exp_avg_absmax, exp_avg_sq_absmax;
};

// Moment `which` (0: exp_avg, 1: exp_avg_sq) of a state in fp32, whatever its storage.
torch::Tensor moment_fp32(const AdamWState& st, int which);
// Stores fp32 `value` into moment `which` in the state's own storage (cast or quantised).
void set_moment(AdamWState& st, int which, const torch::Tensor& value);

struct MomentPrecision {
  config::StateDtype exp_avg = config::StateDtype::kFp32;
  config::StateDtype exp_avg_sq = config::StateDtype::kFp32;
  // CUDA parameters with both moments 8-bit: the fused kernel (kernels/adam8bit.h) instead of
  // the ATen reference (moe.kernels = reference turns it off).
  bool cuda_kernel = true;
  bool fp32() const {
    return exp_avg == config::StateDtype::kFp32 && exp_avg_sq == config::StateDtype::kFp32;
  }
};
inline constexpr int64_t kMin8BitNumel = 4096;  // bitsandbytes' min_8bit_size

// The master weights of 16-bit parameters: fp32 copies, or (kBf16) the weights themselves with a
// Kahan compensation.
using MainParamsDtype = config::ParamDtype;

struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = true;             // page-locked host buffers (CUDA only): async copies
  int64_t bucket_bytes = 64ll << 20;  // gradient bytes per copy/update bucket
  // 16-bit parameters reach the step with fp32 gradients (sums over micro-batches, or fp16's
  // widened ones: accumulate_micro_batch): their host staging is fp32, not 16-bit.
  bool fp32_gradient_sums = false;
};

class FusedAdamW {
 public:
  FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps,
             OffloadOptions offload = {}, MomentPrecision precision = {},
             MainParamsDtype main_params = MainParamsDtype::kFp32);
  ~FusedAdamW();
  // One update at learning rate `lr`. Parameters without a gradient are left alone.
  void step(double lr, const std::optional<torch::Tensor>& grad_scale = std::nullopt,
            const std::optional<torch::Tensor>& found_inf = std::nullopt);
  // The same update with the learning rate in a device tensor and the skip decided on the device
  // (found_inf != 0 skips): no host values, so a CUDA graph can capture it. Not with offload.
  void step_capturable(const torch::Tensor& lr, const torch::Tensor& found_inf,
                       const std::optional<torch::Tensor>& grad_scale = std::nullopt);
  void zero_grad();
  // Gradient accumulation of 16-bit parameters in fp32: after each micro-batch's backward, their
  // 16-bit gradients are added into fp32 sums and released; after the last one the sums become
  // the gradients (fp32) that clipping and the update read. A no-op without 16-bit parameters.
  void accumulate_micro_batch(bool last);
  bool has_16bit_params() const { return sixteen_bit_ > 0; }
  std::vector<std::pair<std::string, AdamWState*>> named_state();
  // The fp32 value of parameter `name` that a checkpoint stores (master weights are written in
  // fp32 so any tier can load them): a host tensor, or undefined for an fp32 working weight.
  torch::Tensor master_weight_host(const std::string& name) const;
  // A checkpoint's fp32 value for `name` (and, for a bf16 master, its compensation if the file
  // has one): sets the master or compensation and rounds the working weight from it.
  void load_master_weight(const std::string& name, const torch::Tensor& value,
                          const std::optional<torch::Tensor>& compensation);
  // The bf16 masters' compensation buffers, by parameter name (checkpointed as NAME.compensation).
  std::vector<std::pair<std::string, torch::Tensor>> named_compensation() const;
  // Offload: the host master copy is the truth; call after the model's weights were replaced
  // (a checkpoint load) so the next update starts from them. A no-op without offload.
  void reload_master_weights();
  bool offloaded() const { return offload_.enabled; }
  // Offload: the host bytes this optimizer holds for the run (master weights, gradient staging
  // or streamed gradients, moments); what `moe-train plan` counts as the host's states. Without
  // the step counts (4 bytes per tensor). The staging of the copied-after-the-backward path
  // exists from the first step on.
  int64_t host_bytes() const;
  // Offload: every gradient is copied to the host as soon as autograd has accumulated it, during
  // the backward (offload_gradient_stream.h); the step runner then unscales and clips the host
  // copies. Call once, before the first step (one process: no data-parallel reduction between).
  void stream_gradients_in_backward();
  bool streams_gradients() const { return stream_ != nullptr; }
  // Streaming: before each micro-batch's backward (`last`: the step's last one).
  void begin_backward(bool last);
  // Streaming, after the last backward: waits for the copies.
  void finish_streamed_gradients();
  // Streaming: the host fp32 gradient of `param` this step (undefined when it has none). The
  // caller orders them (the clipping norm's sum follows the model's parameter order).
  torch::Tensor streamed_gradient(const torch::Tensor& param) const;
  const MomentPrecision& precision() const { return precision_; }

 private:
  // A step's loss-scale inputs: the tensors for the fused kernel, and for the reference update
  // their values, read on the host once per step.
  struct Scaling {
    std::optional<torch::Tensor> grad_scale, found_inf;
    bool skip = false;     // found_inf != 0
    double divisor = 1.0;  // grad_scale's value
  };
  Scaling scaling(const std::optional<torch::Tensor>& grad_scale,
                  const std::optional<torch::Tensor>& found_inf) const;
  void allocate_host_staging();
  void step_offloaded(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf);
  struct OffloadBucket {
    size_t group;
    std::vector<size_t> index;
  };
  std::vector<OffloadBucket> offload_buckets(bool& on_cuda) const;

  struct Lists;
  Lists with_grads(size_t group);
  template <typename Lr>
  void update_groups(const Lr& lr, const Scaling& s);
  // The reference update of one parameter (bf16 / 8-bit moments): `param` is the working weight
  // or the host master, `grad` its gradient (fp32, scaled by grad_scale when given).
  void update_reference(torch::Tensor& param, const torch::Tensor& grad, AdamWState& st, double lr,
                        double weight_decay, double grad_scale);
  AdamWState make_state(const torch::Tensor& like) const;
  // The update of 16-bit parameters of group g, a bucket at a time (not offloaded).
  void update_16bit(size_t g, double lr, const Scaling& s);
  // Adam on fp32 views: one fused call (fp32 moments) or the reference per parameter.
  void adam_fp32(std::vector<torch::Tensor>& w, std::vector<torch::Tensor>& g,
                 std::vector<AdamWState*>& st, double lr, double weight_decay, const Scaling& s);
  std::pair<size_t, size_t> locate(const std::string& name) const;

  std::vector<AdamWGroup> groups_;
  std::vector<std::vector<AdamWState>> state_;
  double beta1_, beta2_, eps_;
  OffloadOptions offload_;
  MomentPrecision precision_;
  MainParamsDtype main_params_;
  int64_t sixteen_bit_ = 0;  // parameters held in 16 bits
  // Per group and parameter. master_: fp32 master weights (offload: every parameter, on the
  // host; otherwise 16-bit parameters only). host_grad_: offload's gradient staging (pinned).
  // compensation_: bf16 Kahan compensation of a bf16 master. grad_sum_: fp32 micro-batch sums.
  std::vector<std::vector<torch::Tensor>> master_, host_grad_, compensation_, grad_sum_;
  // Offload: master_ and host_grad_ are views of these (host_arena.h says why).
  HostArena host_masters_, host_staging_;
  int64_t extra_host_bytes_ = 0;    // staging allocated outside host_staging_ (unplanned)
  std::vector<size_t> first_slot_;  // per group: its first parameter's index in stream_
  std::unique_ptr<OffloadGradientStream> stream_;
  std::unordered_map<const void*, size_t> slot_of_;  // a parameter's index in stream_
};

}  // namespace moe::optim
