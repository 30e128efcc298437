// AdamW as one fused multi-tensor update per parameter group (at::_fused_adamw_, which LibTorch
// implements for CPU (vectorised, at::parallel_for) and CUDA), the same math as
// torch.optim.AdamW(fused=True). Optional grad_scale / found_inf make fp16 unscaling and overflow
// skipping part of the same kernel. State (exp_avg, exp_avg_sq, step) is addressable by
// parameter name for checkpoints.
//
// Offload (DeepSpeed's zero_optimization.offload_optimizer.device = "cpu"): the fp32 master
// weights and the Adam state live in (pinned) host memory and the update runs on the CPU. Each
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
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "moe/config/choices.h"

namespace moe::train {

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
  bool fp32() const {
    return exp_avg == config::StateDtype::kFp32 && exp_avg_sq == config::StateDtype::kFp32;
  }
};
inline constexpr int64_t kMin8BitNumel = 4096;  // bitsandbytes' min_8bit_size

struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = true;             // page-locked host buffers (CUDA only): async copies
  int64_t bucket_bytes = 64ll << 20;  // gradient bytes per copy/update bucket
};

class FusedAdamW {
 public:
  FusedAdamW(std::vector<AdamWGroup> groups, double beta1, double beta2, double eps,
             OffloadOptions offload = {}, MomentPrecision precision = {});
  // One update at learning rate `lr`. Parameters without a gradient are left alone.
  void step(double lr, const std::optional<torch::Tensor>& grad_scale = std::nullopt,
            const std::optional<torch::Tensor>& found_inf = std::nullopt);
  // The same update with the learning rate in a device tensor and the skip decided on the device
  // (found_inf != 0 skips): no host values, so a CUDA graph can capture it. Not with offload.
  void step_capturable(const torch::Tensor& lr, const torch::Tensor& found_inf);
  void zero_grad();
  std::vector<std::pair<std::string, AdamWState*>> named_state();
  // Offload: the host master copy is the truth; call after the model's weights were replaced
  // (a checkpoint load) so the next update starts from them. A no-op without offload.
  void reload_master_weights();
  bool offloaded() const { return offload_.enabled; }
  const MomentPrecision& precision() const { return precision_; }

 private:
  void step_on_device(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf);
  void step_offloaded(double lr, const std::optional<torch::Tensor>& grad_scale,
                      const std::optional<torch::Tensor>& found_inf);

  struct Lists;
  Lists with_grads(size_t group);
  template <typename Lr>
  void update_groups(const Lr& lr, const std::optional<torch::Tensor>& grad_scale,
                     const std::optional<torch::Tensor>& found_inf);
  // The reference update of one parameter (bf16 / 8-bit moments): `param` is the working weight
  // or the host master, `grad` its gradient (fp32, scaled by grad_scale when given).
  void update_reference(torch::Tensor& param, const torch::Tensor& grad, AdamWState& st, double lr,
                        double weight_decay, double grad_scale);
  AdamWState make_state(const torch::Tensor& like) const;

  std::vector<AdamWGroup> groups_;
  std::vector<std::vector<AdamWState>> state_;
  double beta1_, beta2_, eps_;
  OffloadOptions offload_;
  MomentPrecision precision_;
  // Offload only, per group and parameter: fp32 master weights and gradient staging buffers.
  std::vector<std::vector<torch::Tensor>> master_, host_grad_;
};

}  // namespace moe::train
