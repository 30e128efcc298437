// `moe-train env`: what DeepSpeed's ds_report and the seed guide's environment checks look at
// (LibTorch, CUDA runtime, cuDNN, NCCL, GPUs and their architectures against ours, driver, CPU,
// memory, the free space and write speed of the run's directories, relevant environment
// variables), each with a verdict: ok, warn or fail.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::env {

// dirs: directories whose free space and write throughput to measure (created if missing? no:
// a missing directory is reported as a warning).
nlohmann::json environment_report(const std::vector<std::string>& dirs);

// Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX-BF16, from
// /proc/cpuinfo): without either, LibTorch's CPU bf16 GEMM is a slow fallback.
bool cpu_has_native_bf16();

// CUDA device `device`'s PCI bus id ("0000:17:00.0"); "" without CUDA.
std::string gpu_pci_bus_id(int device);

}  // namespace moe::env
