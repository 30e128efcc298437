// The spec-peak table behind MFU: CUDA's device names map to the right datasheet row (the most
// specific one), unknown devices get none, and the two attention conventions differ by exactly
// the halved score FLOPs.
#include <gtest/gtest.h>

#include "moe/config/config.h"
#include "moe/monitor/device_peak.h"

namespace {

using moe::monitor::spec_peak;

double tflops(const char* name) {
  const auto p = spec_peak(name);
  return p ? p->tflops : 0.0;
}

TEST(DevicePeak, CudaNamesMapToTheirDatasheetRow) {
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H200 NVL"), 835.5);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 PCIe"), 756.5);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA H100 NVL"), 835.5);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA GH200 480GB"), 989.4);
  EXPECT_EQ(spec_peak("NVIDIA GH200 480GB")->model, "GH200");
  EXPECT_DOUBLE_EQ(tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA A100 80GB PCIe"), 312.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA A10"), 125.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA L40S"), 362.05);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA L40"), 181.05);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA L4"), 121.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA B200"), 2250.0);
  EXPECT_DOUBLE_EQ(tflops("NVIDIA GeForce RTX 4090"), 165.2);
  EXPECT_DOUBLE_EQ(tflops("Tesla V100-SXM2-32GB"), 125.0);
}

TEST(DevicePeak, UnknownDevicesHaveNoPeak) {
  EXPECT_FALSE(spec_peak("NVIDIA A10G"));  // not A10: a different chip and clock
  EXPECT_FALSE(spec_peak("NVIDIA GeForce RTX 3090"));
  EXPECT_FALSE(spec_peak("cpu"));
  EXPECT_FALSE(spec_peak(""));
  EXPECT_DOUBLE_EQ(moe::monitor::model_flops_utilisation(1e5, 1e9, 0), 0.0);
}

TEST(DevicePeak, EveryRowHasASourceAndAPositivePeak) {
  for (const auto& row : moe::monitor::spec_peak_table()) {
    EXPECT_FALSE(row.tokens.empty());
    EXPECT_GT(row.peak.tflops, 0);
    EXPECT_FALSE(row.peak.source.empty()) << row.peak.model;
  }
}

TEST(DevicePeak, MfuIsAchievedOverPeak) {
  // 95,000 tokens/s x 5e9 FLOPs per token on a 989.4 TFLOP/s device.
  EXPECT_NEAR(moe::monitor::model_flops_utilisation(95000, 5e9, 989.4e12), 0.48009, 1e-5);
}

TEST(DevicePeak, CausalConventionHalvesOnlyTheAttentionScores) {
  moe::config::Config c;
  c.model.hidden_size = 256;
  c.model.num_heads = 4;
  c.model.num_layers = 3;
  c.model.seq_len = 1024;
  const double full = moe::config::training_flops_per_token(c);
  const double causal = moe::config::training_flops_per_token(c, /*causal_half=*/true);
  // 3 x (forward) x L layers x 2 S (H hd) of the 4 S (H hd) score FLOPs.
  EXPECT_DOUBLE_EQ(full - causal, 3.0 * 3 * 2 * 1024 * 256);
}

}  // namespace
