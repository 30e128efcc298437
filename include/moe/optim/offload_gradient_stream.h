// ZeRO-Offload's gradient path (zero_optimization.offload_optimizer.device = cpu with
// overlap_comm, one process): each gradient leaves the device as soon as autograd has
// accumulated it, on a side CUDA stream into pinned host memory, while the backward goes on
// with the layers below. The host holds every gradient in fp32:
//  - a 16-bit gradient (training.param_dtype bf16/fp16) is copied in 16 bits at every
//    micro-batch (and at every accumulation within one), its device copy released at once, and
//    added into the fp32 host sum when the copy has landed: the device never holds an fp32
//    gradient or a second micro-batch's 16-bit one;
//  - an fp32 gradient keeps accumulating on the device over the micro-batches and is copied
//    once, in the last one.
// After the backward, finish() waits for the copies; unscaling, the norm, clipping and the
// AdamW update then run on the host copies (as DeepSpeed's CPU optimizer does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/types.h>

#include "moe/optim/host_arena.h"

namespace moe::optim {

class OffloadGradientStream {
 public:
  // `params`: the trained parameters (leaves), whose post-accumulate-grad hooks this installs.
  OffloadGradientStream(std::vector<torch::Tensor> params, bool pin_memory);
  ~OffloadGradientStream();  // removes the hooks
  OffloadGradientStream(const OffloadGradientStream&) = delete;
  OffloadGradientStream& operator=(const OffloadGradientStream&) = delete;

  // Before each micro-batch's backward; `last`: the step's last micro-batch.
  void begin_backward(bool last) { last_ = last; }
  // After the last backward: waits for every copy. Whether parameter k got a gradient this
  // step; if so host_gradient(k) holds it in fp32.
  void finish();
  bool has_gradient(size_t k) const { return got_[k] != 0; }
  torch::Tensor& host_gradient(size_t k) { return host_fp32_[k]; }
  // The pinned 16-bit buffer of a 16-bit parameter (undefined for fp32 ones): after finish()
  // it is free, and the optimizer sends the updated weight back through it.
  torch::Tensor& staging(size_t k) { return staging16_[k]; }
  // Copies in both directions share one stream so a later gradient copy into staging(k) is
  // ordered after the weight copy out of it. Created on first use (CUDA only).
  std::optional<torch::Stream> copy_stream(const torch::Device& device);
  // A new step: no parameter has a gradient.
  void clear();
  // The host bytes of the fp32 gradients and the 16-bit staging (one buffer per dtype).
  int64_t host_bytes() const { return arena_.bytes(); }

 private:
  void gradient_ready(size_t k);
  void add_staged(size_t k);  // a landed 16-bit copy into the fp32 sum
  void wait_copy(size_t k);

  HostArena arena_;  // host_fp32_ and staging16_ are views of its buffers
  std::vector<torch::Tensor> params_, host_fp32_, staging16_;
  std::vector<uint8_t> got_, staged_, summed_;
  struct CudaState;  // the copy stream and one event per parameter
  std::unique_ptr<CudaState> cuda_;
  bool pin_memory_ = true;
  bool last_ = true;
};

}  // namespace moe::optim
