#include "moe/env/cuda_arch.h"

#include <sstream>
#include <vector>

namespace moe::env {

namespace {

struct Arch {
  int major = 0, minor = 0;
  bool specific = false;  // "90a": sm_90a SASS runs on sm_90 only
  bool sass = true, ptx = true;
};

bool parse(const std::string& item, Arch& a) {
  std::string num = item;
  const auto dash = item.find('-');
  if (dash != std::string::npos) {
    const std::string kind = item.substr(dash + 1);
    num = item.substr(0, dash);
    a.sass = kind == "real";
    a.ptx = kind == "virtual";
    if (!a.sass && !a.ptx) return false;
  }
  if (!num.empty() && (num.back() == 'a' || num.back() == 'f')) {
    a.specific = true;
    num.pop_back();
  }
  if (num.size() < 2 || num.find_first_not_of("0123456789") != std::string::npos) return false;
  a.major = std::stoi(num.substr(0, num.size() - 1));
  a.minor = num.back() - '0';
  return true;
}

}  // namespace

ArchCoverage cuda_arch_coverage(const std::string& cmake_archs, int major, int minor) {
  std::vector<Arch> archs;
  std::istringstream in(cmake_archs);
  for (std::string item; std::getline(in, item, ';');) {
    Arch a;
    if (parse(item, a)) archs.push_back(a);
  }
  const int device = major * 10 + minor;
  const std::string sm = std::to_string(major) + std::to_string(minor);
  // Native code first: no JIT, the build's own optimisation.
  for (const Arch& a : archs) {
    const bool runs = a.specific ? (a.major == major && a.minor == minor)
                                 : (a.major == major && a.minor <= minor);
    if (a.sass && runs) {
      return {true, "SASS sm_" + std::to_string(a.major) + std::to_string(a.minor) +
                        (a.specific ? "a" : "")};
    }
  }
  int best = -1;
  for (const Arch& a : archs) {
    const int v = a.major * 10 + a.minor;
    if (a.ptx && !a.specific && v <= device && v > best) best = v;
  }
  if (best >= 0) {
    return {true, "PTX compute_" + std::to_string(best) + " (compiled by the driver at first use)"};
  }
  return {false, "no SASS for sm_" + sm + " and no PTX at or below it in [" + cmake_archs + "]"};
}

}  // namespace moe::env
