// Placement on the node (issue 29): the NUMA topology from sysfs, the CPUs near a GPU (its PCI
// device's local_cpulist, what NVML's nvmlDeviceGetCpuAffinity reads), and pinning every thread
// of the process to a CPU set (training.cpu_affinity), as the seed guide's numactl / cgroups
// recipe does from outside.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/util/cpu_list.h"

namespace moe::env {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;
  int64_t memory_mib = 0;
};
// /sys/devices/system/node/node*; empty where the kernel exposes no NUMA information.
std::vector<NumaNode> numa_nodes(const std::string& sys_root = "/sys");

using ::moe::format_cpu_list;  // util/cpu_list.h
using ::moe::parse_cpu_list;

// The CPUs near the PCI device `bus_id` (e.g. "0000:17:00.0", cudaDeviceGetPCIBusId's form);
// empty when sysfs does not say.
std::vector<int> pci_local_cpus(const std::string& bus_id, const std::string& sys_root = "/sys");

std::vector<int> allowed_cpus();  // sched_getaffinity of this process

// Pins every thread of this process (each task of /proc/self/task; threads started later inherit
// it from their creator) to `cpus`. A CPU this process may not use throws UserError naming
// `what`, before any thread is moved.
void pin_process_to(const std::vector<int>& cpus, const std::string& what);

}  // namespace moe::env
