#include "moe/monitor/device_peak.h"

#include <algorithm>

namespace moe::monitor {

namespace {

std::vector<std::string> words(std::string_view name) {
  std::vector<std::string> out;
  std::string w;
  for (const char c : name) {
    if (c == ' ' || c == '-') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) out.push_back(w);
  return out;
}

}  // namespace

const std::vector<SpecPeakRow>& spec_peak_table() {
  // Dense (no 2:4 sparsity) BF16 tensor-core TFLOP/s from NVIDIA's datasheets; most specific
  // rows first (GH200 before H200, H100 PCIe before H100, A100 before A10, L40S before L40).
  static const std::vector<SpecPeakRow> table = {
      {{"GH200"}, {"GH200", 989.4, "NVIDIA GH200 Grace Hopper Superchip datasheet"}},
      {{"H200", "NVL"}, {"H200 NVL", 835.5, "NVIDIA H200 datasheet (NVL column)"}},
      {{"H200"}, {"H200 SXM", 989.4, "NVIDIA H200 datasheet (SXM column)"}},
      {{"H100", "PCIe"}, {"H100 PCIe", 756.5, "NVIDIA H100 datasheet (PCIe column)"}},
      {{"H100", "NVL"}, {"H100 NVL", 835.5, "NVIDIA H100 NVL datasheet"}},
      {{"H100"}, {"H100 SXM", 989.4, "NVIDIA H100 datasheet (SXM column)"}},
      {{"B200"}, {"B200", 2250.0, "NVIDIA DGX B200 / HGX B200 datasheet, per GPU"}},
      {{"A100"}, {"A100", 312.0, "NVIDIA A100 datasheet"}},
      {{"A10"}, {"A10", 125.0, "NVIDIA A10 datasheet"}},
      {{"L40S"}, {"L40S", 362.05, "NVIDIA L40S datasheet"}},
      {{"L40"}, {"L40", 181.05, "NVIDIA L40 datasheet"}},
      {{"L4"}, {"L4", 121.0, "NVIDIA L4 datasheet"}},
      {{"RTX", "4090"}, {"GeForce RTX 4090", 165.2, "NVIDIA Ada Lovelace architecture whitepaper"}},
      {{"V100"}, {"V100 (FP16)", 125.0, "NVIDIA V100 datasheet (SXM2)"}},
  };
  return table;
}

std::optional<SpecPeak> spec_peak(std::string_view device_name) {
  const std::vector<std::string> name = words(device_name);
  for (const SpecPeakRow& row : spec_peak_table()) {
    const bool all = std::all_of(row.tokens.begin(), row.tokens.end(), [&](const std::string& t) {
      return std::find(name.begin(), name.end(), t) != name.end();
    });
    if (all) return row.peak;
  }
  return std::nullopt;
}

double model_flops_utilisation(double tokens_per_s_per_gpu, double flops_per_token,
                               double peak_flops) {
  return peak_flops > 0 ? tokens_per_s_per_gpu * flops_per_token / peak_flops : 0.0;
}

}  // namespace moe::monitor
