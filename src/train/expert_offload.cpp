#include "moe/train/expert_offload.h"

#include <ATen/cuda/CUDAContext.h>

#include <stdexcept>

#include "moe/config/lora.h"
#include "moe/kernels/permute.h"
#include "moe/plan/memory_plan.h"

namespace moe::train {

config::Config settle_expert_offload(const config::Config& cfg, const torch::Device& device,
                                     spdlog::logger& log) {
  config::Config out = cfg;
  if (cfg.moe.offload_experts != config::OffloadExperts::kAuto) return out;
  out.moe.offload_experts = config::OffloadExperts::kOff;
  if (!device.is_cuda() || !config::lora_enabled(cfg)) return out;
  plan::PlanOptions po;
  po.cuda_kernels = kernels::cuda_kernels_compiled();
  po.device_bytes = static_cast<double>(
      at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->totalGlobalMem);
  const plan::MemoryPlan p = plan::plan_memory(cfg, po);
  if (!p.expert_offload.on) return out;
  out.moe.offload_experts = config::OffloadExperts::kOn;
  log.info(
      "moe.offload_experts auto: on (every expert on this {:.2f} GiB device does not fit): "
      "{:.2f} GiB of frozen experts in host memory, a {:.2f} GiB ring; {:.2f} GiB planned",
      po.device_bytes / (1 << 30), p.expert_offload.host_bytes / (1 << 30),
      p.expert_offload.ring_bytes / (1 << 30), p.reserved / (1 << 30));
  return out;
}

void report_expert_offload(const model::TransformerLM& model, spdlog::logger& log) {
  const auto& ring = model->expert_ring();
  if (!ring) return;
  const layers::OffloadCounters c = ring->counters();
  log.info("expert offload: {}", ring->summary());
  const int64_t planned = ring->slots() * ring->largest_layer_bytes();
  if (c.peak_slot_bytes > planned) {
    throw std::runtime_error("expert offload: the ring held " + std::to_string(c.peak_slot_bytes) +
                             " bytes on the device, more than its " +
                             std::to_string(ring->slots()) + " layers (" + std::to_string(planned) +
                             " bytes): a bug, please report it");
  }
}

}  // namespace moe::train
