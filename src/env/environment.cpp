#include "moe/env/environment.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "moe/build_info.h"
#include "moe/env/cuda_arch.h"
#include "moe/env/placement.h"
#include "moe/kernels/permute.h"
#include "torch/headeronly/version.h"

#ifdef MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moe::env {

using nlohmann::json;

namespace {

json check(const std::string& name, const std::string& verdict, const std::string& detail) {
  return {{"check", name}, {"verdict", verdict}, {"detail", detail}};
}

std::string version_string(long v, long major_div, long minor_div) {
  if (v <= 0) return "unknown";
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div) + "." +
         std::to_string(v % minor_div);
}

int64_t meminfo_kib(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  int64_t v = 0;
  std::string unit;
  while (in >> k >> v >> unit) {
    if (k == key + ":") return v;
  }
  return -1;
}

// Write 64 MiB with one fsync and time it; removes the probe file.
double write_mib_per_s(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / ".moe-train-env-probe").string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  std::string block(1 << 20, 'x');
  auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  for (int i = 0; i < 64 && ok; ++i)
    ok = ::write(fd, block.data(), block.size()) == static_cast<ssize_t>(block.size());
  ok = ok && ::fsync(fd) == 0;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  ::unlink(path.c_str());
  return ok ? 64.0 / s : -1;
}

}  // namespace

// The NUMA topology, where this process may run, and (with GPUs) the CPUs near each GPU: a
// process whose CPUs are all on another node than its GPU pays the inter-socket link on every
// host-device copy (the seed guide binds the trainer with numactl; training.cpu_affinity).
static void add_placement_checks(json& checks, int64_t gpus) {
  const auto nodes = numa_nodes();
  std::string topology;
  for (const auto& n : nodes) {
    topology += (topology.empty() ? "" : "; ") +
                ("node " + std::to_string(n.id) + ": CPUs " + format_cpu_list(n.cpus) + ", " +
                 std::to_string(n.memory_mib) + " MiB");
  }
  checks.push_back(check("NUMA", "ok",
                         nodes.empty() ? "no NUMA information in /sys (one node)"
                                       : std::to_string(nodes.size()) + " node(s): " + topology));
  const auto mine = allowed_cpus();
  checks.push_back(
      check("CPU affinity", "ok",
            "this process may run on CPUs " + format_cpu_list(mine) +
                " (training.cpu_affinity, numactl or systemd's CPUAffinity= narrow it)"));
  for (int64_t i = 0; i < gpus; ++i) {
    const std::string bus = gpu_pci_bus_id(static_cast<int>(i));
    const auto near = bus.empty() ? std::vector<int>{} : pci_local_cpus(bus);
    if (near.empty()) continue;
    const bool overlaps = std::any_of(mine.begin(), mine.end(), [&](int c) {
      return std::binary_search(near.begin(), near.end(), c);
    });
    checks.push_back(check("GPU " + std::to_string(i) + " placement", overlaps ? "ok" : "warn",
                           "PCI " + bus + ", near CPUs " + format_cpu_list(near) +
                               (overlaps ? ""
                                         : ": this process runs on none of them (far from "
                                           "its GPU; set training.cpu_affinity = auto)")));
  }
}

#ifdef MOE_HAVE_CUDA
// Host-to-device bandwidth of pinned memory on the current device (what the expert offload
// tier's copies run at): 4 copies of 256 MiB after one to warm up, timed by CUDA events; 0 when
// the buffers cannot be had.
static double pinned_host_to_device_gb_per_s() {
  constexpr size_t kBytes = size_t{256} << 20;
  void *host = nullptr, *dev = nullptr;
  double gbps = 0;
  if (cudaMallocHost(&host, kBytes) == cudaSuccess && cudaMalloc(&dev, kBytes) == cudaSuccess) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaMemcpy(dev, host, kBytes, cudaMemcpyHostToDevice);
    cudaEventRecord(start);
    for (int i = 0; i < 4; ++i) cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice);
    cudaEventRecord(stop);
    float ms = 0;
    if (cudaEventSynchronize(stop) == cudaSuccess &&
        cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms > 0) {
      gbps = 4.0 * static_cast<double>(kBytes) / (ms / 1000.0) / 1e9;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  if (dev) cudaFree(dev);
  if (host) cudaFreeHost(host);
  return gbps;
}

// The current device's pinned host-to-device bandwidth, as a check of its own.
static void add_host_link_check(json& checks, int64_t gpu) {
  const double gbps = pinned_host_to_device_gb_per_s();
  if (gbps <= 0) return;
  std::ostringstream b;
  b.precision(3);
  b << gbps << " GB/s host -> device from pinned memory (256 MiB x 4); moe-train plan "
    << "--link-gbps " << gbps << " times the expert offload tier's copies with it";
  checks.push_back(check("GPU " + std::to_string(gpu) + " host link", "ok", b.str()));
}
#endif

json environment_report(const std::vector<std::string>& dirs) {
  json checks = json::array();
  // A stream, not string +: GCC 12 reports a false -Warray-bounds on the inlined concatenation
  // of these compile-time strings in some configurations (the cpu-only preset).
  std::ostringstream version;
  version << build_info::kVersion << " (commit " << build_info::kGitCommit << ")";
  checks.push_back(check("moe-train", "ok", version.str()));
  checks.push_back(check("LibTorch", "ok", TORCH_VERSION));
  const std::string archs = build_info::kCudaKernels ? build_info::kCudaArchitectures : "";
  checks.push_back(check(
      "CUDA kernels", build_info::kCudaKernels ? "ok" : "warn",
      build_info::kCudaKernels
          ? "compiled for " + archs + " (CMake's list: -real = SASS, -virtual = PTX, bare = both)"
          : "not compiled (CPU-only build)"));
  const auto& hooks = at::detail::getCUDAHooks();
  const bool torch_cuda = hooks.hasCUDA() || build_info::kCudaKernels;
  if (torch_cuda) {
    long rt = 0, dnn = 0;
    try {
      rt = hooks.versionCUDART();
    } catch (...) {
    }
    try {
      dnn = hooks.versionRuntimeCuDNN();
    } catch (...) {
    }
    checks.push_back(check("CUDA runtime", rt > 0 ? "ok" : "warn", version_string(rt, 1000, 10)));
    checks.push_back(check("cuDNN", dnn > 0 ? "ok" : "warn", version_string(dnn, 10000, 100)));
  }
  {
    using GetVersion = int (*)(int*);
    void* nccl = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
    int v = 0;
    if (nccl != nullptr) {
      if (auto f = reinterpret_cast<GetVersion>(::dlsym(nccl, "ncclGetVersion"))) f(&v);
    }
    checks.push_back(check("NCCL", v > 0 ? "ok" : "warn",
                           v > 0 ? version_string(v, 10000, 100) + " (not needed on one GPU)"
                                 : "not found (not needed on one GPU)"));
  }
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  if (gpus == 0) {
    checks.push_back(check("GPU", "warn",
                           "no CUDA device visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES "
                           "hides them): training runs on the CPU"));
  }
#ifdef MOE_HAVE_CUDA
  int driver = 0;
  if (gpus > 0 && cudaDriverGetVersion(&driver) == cudaSuccess) {
    checks.push_back(check("NVIDIA driver (CUDA API)", "ok", version_string(driver, 1000, 10)));
  }
  for (int64_t i = 0; i < gpus; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, static_cast<int>(i)) != cudaSuccess) continue;
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(static_cast<int>(i));
    cudaMemGetInfo(&free_b, &total_b);
    const std::string sm = std::to_string(p.major) + std::to_string(p.minor);
    const ArchCoverage cover = cuda_arch_coverage(archs, p.major, p.minor);
    std::ostringstream d;
    d << p.name << ", sm_" << sm << ", " << (total_b >> 20) << " MiB (" << (free_b >> 20)
      << " MiB free); our kernels: "
      << (cover.covered ? cover.how : "not runnable here (" + cover.how + ")");
    checks.push_back(check("GPU " + std::to_string(i), cover.covered ? "ok" : "warn", d.str()));
    add_host_link_check(checks, i);
  }
#endif
  checks.push_back(
      check("CPU", "ok", std::to_string(std::thread::hardware_concurrency()) + " logical cores"));
  add_placement_checks(checks, gpus);
  const int64_t total = meminfo_kib("MemTotal"), avail = meminfo_kib("MemAvailable");
  checks.push_back(check("memory", "ok",
                         std::to_string(total >> 10) + " MiB total, " +
                             std::to_string(avail >> 10) + " MiB available"));
  for (const auto& dir : dirs) {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) {
      checks.push_back(check("directory " + dir, "warn", "does not exist (yet)"));
      continue;
    }
    const double free_gib = static_cast<double>(st.f_bavail) * st.f_frsize / (1 << 30);
    const double mibs = write_mib_per_s(dir);
    std::ostringstream d;
    d.precision(3);
    d << free_gib << " GiB free, ";
    if (mibs > 0)
      d << "writes " << mibs << " MiB/s (64 MiB + fsync)";
    else
      d << "not writable";
    checks.push_back(check("directory " + dir, mibs > 0 && free_gib > 1 ? "ok" : "warn", d.str()));
  }
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    checks.push_back(check(var, "ok", v ? v : "(unset)"));
  }
  return {{"checks", checks}};
}

std::string gpu_pci_bus_id(int device) {
#ifdef MOE_HAVE_CUDA
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) == cudaSuccess) return id;
#endif
  (void)device;
  return "";
}

bool cpu_has_native_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      if (w == "avx512_bf16" || w == "amx_bf16") return true;
    }
    return false;  // the first CPU's flags are every CPU's
  }
  return false;
}

}  // namespace moe::env
