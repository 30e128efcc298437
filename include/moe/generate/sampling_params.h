// The sampling settings of a generation, with transformers' GenerationConfig defaults.
#pragma once

#include <cstdint>
#include <optional>

namespace moe::generate {

struct SamplingParams {
  bool do_sample = false;  // false: greedy (the warpers below are not applied)
  double temperature = 1.0;
  int64_t top_k = 50;  // 0 = off
  double top_p = 1.0;
  std::optional<double> min_p;  // unset = off
  double repetition_penalty = 1.0;
  uint64_t seed = 0;
};

}  // namespace moe::generate
