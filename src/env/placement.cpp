#include "moe/env/placement.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/util/errors.h"

namespace moe::env {

namespace fs = std::filesystem;

namespace {
std::string first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}
}  // namespace

std::vector<NumaNode> numa_nodes(const std::string& sys_root) {
  std::vector<NumaNode> nodes;
  const fs::path dir = fs::path(sys_root) / "devices/system/node";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        !std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      continue;
    }
    NumaNode n;
    n.id = std::stoi(name.substr(4));
    const std::string list = first_line(e.path() / "cpulist");
    if (!list.empty()) n.cpus = parse_cpu_list(list, (e.path() / "cpulist").string());
    std::ifstream mem(e.path() / "meminfo");
    for (std::string line; std::getline(mem, line);) {
      const auto at = line.find("MemTotal:");
      if (at != std::string::npos) n.memory_mib = std::stoll(line.substr(at + 9)) / 1024;
    }
    nodes.push_back(n);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return nodes;
}

std::vector<int> pci_local_cpus(const std::string& bus_id, const std::string& sys_root) {
  std::string id = bus_id;
  std::transform(id.begin(), id.end(), id.begin(), ::tolower);
  const std::string list =
      first_line(fs::path(sys_root) / "bus/pci/devices" / id / "local_cpulist");
  return list.empty() ? std::vector<int>{} : parse_cpu_list(list, "local_cpulist of " + id);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

void pin_process_to(const std::vector<int>& cpus, const std::string& what) {
  const std::vector<int> allowed = allowed_cpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= CPU_SETSIZE || !std::binary_search(allowed.begin(), allowed.end(), c)) {
      throw UserError(what + " = \"" + format_cpu_list(cpus) + "\": CPU " + std::to_string(c) +
                      " is not available to this process (it may use " + format_cpu_list(allowed) +
                      ")");
    }
    CPU_SET(c, &set);
  }
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    // A thread that ended since the listing is no error.
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH) {
      throw TrainingError(what + ": cannot pin thread " + std::to_string(tid) + ": " +
                          std::strerror(errno));
    }
  }
}

}  // namespace moe::env
