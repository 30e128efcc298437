#include "moe/train/device.h"

#include <torch/torch.h>

#include "moe/env/environment.h"
#include "moe/env/placement.h"
#include "moe/model/attention_backend.h"
#include "moe/moe/dispatcher.h"
#include "moe/util/errors.h"

namespace moe::train {

namespace {
torch::Device choose_device(const config::Config& cfg) {
  const bool have_cuda = torch::cuda::is_available();
  if (cfg.training.device == config::TrainingDevice::kCuda) {
    if (!have_cuda) {
      throw UserError("config: " + cfg.source_file +
                      ": training.device = \"cuda\": no CUDA device is visible");
    }
    return torch::kCUDA;
  }
  if (cfg.training.device == config::TrainingDevice::kCpu || !have_cuda) return torch::kCPU;
  return torch::kCUDA;
}
}  // namespace

torch::Device pick_device(const config::Config& cfg) {
  const torch::Device device = choose_device(cfg);
  // The MoE kernel path is settled with the device, not at the first forward: a setting this
  // build or device cannot honour fails before anything is written.
  try {
    (void)moe::resolve_kernel_path(cfg.moe.kernels, device.is_cuda());
  } catch (const UserError& e) {
    throw UserError("config: " + cfg.source_file + ": " + e.what());
  }
  model::apply_attention_backend(cfg.model.attention_backend);
  return device;
}

data::BufferFactory tensor_buffers(const torch::Device& device) {
  const bool pin = device.is_cuda();
  return [pin](int64_t n) {
    auto t = std::make_shared<torch::Tensor>(
        torch::empty({n}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(pin)));
    return data::BatchBuffer{t->data_ptr<int64_t>(), t};
  };
}

torch::Tensor to_device(const data::Batch& b, const torch::Device& device) {
  const auto& t = *static_cast<torch::Tensor*>(b.buffer.owner.get());
  return t.view({b.rows, b.cols}).to(device, /*non_blocking=*/true);
}

std::string apply_cpu_affinity(const config::Config& cfg, int64_t local_rank) {
  const std::string& a = cfg.training.cpu_affinity;
  if (a.empty()) return "";
  std::vector<int> cpus;
  if (a == "auto") {
    const std::string bus = pick_device(cfg).is_cuda()
                                ? env::gpu_pci_bus_id(static_cast<int>(local_rank))
                                : std::string();
    cpus = bus.empty() ? std::vector<int>{} : env::pci_local_cpus(bus);
    if (cpus.empty()) return "";  // nothing near: the OS decides
  } else {
    cpus = env::parse_cpu_list(a, "training.cpu_affinity");
  }
  env::pin_process_to(cpus, "training.cpu_affinity");
  return env::format_cpu_list(cpus);
}

}  // namespace moe::train
