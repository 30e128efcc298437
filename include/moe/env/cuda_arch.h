// Which GPUs a build's fatbin runs on. CMake's CUDA architecture list ("80-real;90-real;
// 100-real;120") holds SASS ("-real"), PTX ("-virtual") or both (a bare number). The CUDA rules:
// SASS for sm_XY runs on devices of the same major version X with minor >= Y (arch-specific
// "XYa" SASS only on sm_XY itself); PTX for compute_XY is compiled by the driver for any device of
// capability >= XY. `moe-train env` says whether the present GPU is covered, and how.
#pragma once

#include <string>

namespace moe::env {

struct ArchCoverage {
  bool covered = false;
  std::string how;  // "SASS sm_80", "PTX compute_120 (JIT at first launch)", or why not
};

ArchCoverage cuda_arch_coverage(const std::string& cmake_archs, int major, int minor);

}  // namespace moe::env
