// What a validation pass measures (no LibTorch: monitoring and the CLI read it too).
#pragma once

#include <cstdint>
#include <vector>

namespace moe::train {

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;  // next-token top-1
  double perplexity = 0.0;
  int64_t tokens = 0;
  // Expert load balance over the evaluation: per layer, max load / mean load (1 = perfect).
  std::vector<double> expert_imbalance;
};

}  // namespace moe::train
