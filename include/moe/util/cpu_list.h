// CPU lists in the kernel's notation ("0-7,16-23"): training.cpu_affinity's value and sysfs's
// cpulist files. Here, below both config (which validates the key) and env (which reads sysfs).
#pragma once

#include <string>
#include <vector>

namespace moe {

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; a bad list throws UserError naming `what`.
std::vector<int> parse_cpu_list(const std::string& text, const std::string& what);
std::string format_cpu_list(const std::vector<int>& cpus);  // the inverse, ranges collapsed

}  // namespace moe
