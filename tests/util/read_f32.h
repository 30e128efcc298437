// The replay tools' input reader (tests/optim/adamw_replay.cpp, tests/moe/router_replay.cpp): an
// F32 tensor of a safetensors file, copied out (data offsets need not be aligned).
#pragma once

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "moe/util/safetensors.h"

namespace moe::test {

inline torch::Tensor read_f32(const SafetensorsFile& f, const std::string& name) {
  const auto& e = f.entry(name);
  auto t = torch::empty(e.shape, torch::kFloat);
  std::memcpy(t.data_ptr(), f.data(e), e.end - e.begin);
  return t;
}

}  // namespace moe::test
