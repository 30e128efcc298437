// training.profile_step_start/end on a GPU (label `gpu`, in moe_gpu_tests; skipped without a
// device): the window's CUDA kernels reach the trace and the table (CUPTI works in this build),
// the GEMMs are recognised as such, and only the window's steps are in the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <torch/torch.h>
#include <unistd.h>

#include "moe/monitor/step_trace.h"
#include "moe/util/remove_tree.h"

namespace moe::monitor {
namespace {

namespace fs = std::filesystem;

TEST(StepTraceGpu, RecordsTheWindowsKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = fs::temp_directory_path() / ("step-trace-gpu-" + std::to_string(getpid()));
  const fs::path file = dir / "rank0.steps2-3.pt.trace.json";
  std::string table;
  {
    StepTrace trace(2, 4, file, /*cuda=*/true);
    const auto a =
        torch::randn({2048, 2048}, torch::TensorOptions(torch::kCUDA).dtype(torch::kBFloat16));
    for (int64_t step = 1; step <= 5; ++step) {
      trace.before_step(step);
      auto c = a.matmul(a).relu_().sum();
      torch::cuda::synchronize();
      if (trace.end_step(step)) table = trace.finish().value_or("");
    }
  }
  ASSERT_FALSE(table.empty()) << "the window's table";
  EXPECT_NE(table.find("trace: 2 step(s)"), std::string::npos) << table;
  EXPECT_NE(table.find("device busy"), std::string::npos) << table;
  EXPECT_NE(table.find("  gemm\n"), std::string::npos) << "cuBLAS's kernel is a gemm\n" << table;
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  EXPECT_NE(json.find("ProfilerStep#2"), std::string::npos);
  EXPECT_NE(json.find("ProfilerStep#3"), std::string::npos);
  EXPECT_EQ(json.find("ProfilerStep#1"), std::string::npos);
  EXPECT_EQ(json.find("ProfilerStep#4"), std::string::npos);
  EXPECT_NE(json.find("\"kernel\""), std::string::npos) << "device kernels in the trace";
  ::moe::remove_tree(dir);
}

}  // namespace
}  // namespace moe::monitor
