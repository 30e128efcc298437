// What a validation pass measures (no LibTorch: monitoring and the CLI read it too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::train {

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;  // next-token top-1
  double perplexity = 0.0;
  int64_t tokens = 0;
  // Expert load balance over the evaluation: per layer, max load / mean load (1 = perfect).
  std::vector<double> expert_imbalance;
  // data.blend: the same figures per source with validation data, in data.blend order.
  struct Source {
    std::string name;
    double loss = 0.0, accuracy = 0.0, perplexity = 0.0;
    int64_t tokens = 0;
  };
  std::vector<Source> sources;
};

}  // namespace moe::train
