// The one place that knows a device's dense 16-bit tensor-core peak, for MFU. MFU is achieved
// model FLOP/s over this spec-sheet peak (PaLM's definition; what Megatron and torchtitan
// report), never over a measured matmul: a measured ceiling hides what the kernels leave on the
// table. Sources and the name matching: docs/benchmarks.md "MFU".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe::monitor {

struct SpecPeak {
  std::string model;   // the table's name for it, e.g. "H100 SXM"
  double tflops = 0;   // dense BF16 (FP16 where the device has no BF16), no sparsity
  std::string source;  // the datasheet it comes from
};

// The peak of a device as CUDA names it ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", ...): the
// first table row all of whose tokens are words of the name (words split at spaces and '-'),
// most specific rows first; none for an unknown device.
std::optional<SpecPeak> spec_peak(std::string_view device_name);

// The whole table, for docs and tests.
struct SpecPeakRow {
  std::vector<std::string> tokens;
  SpecPeak peak;
};
const std::vector<SpecPeakRow>& spec_peak_table();

// Model FLOPs utilisation of one GPU: its share of the tokens per second times the model FLOPs
// per token, over its peak (FLOP/s). 0 when the peak is unknown.
double model_flops_utilisation(double tokens_per_s_per_gpu, double flops_per_token,
                               double peak_flops);

}  // namespace moe::monitor
