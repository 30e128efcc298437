// The profiler window's table: kernels sorted into kinds by their real CUDA names, host
// operators' self time (nested operators subtracted per thread), the device's busy time as the
// union of overlapping streams, and the table's two forms.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moe/monitor/trace_summary.h"

namespace {

using moe::monitor::format_trace_summary;
using moe::monitor::kernel_kind;
using moe::monitor::summarize_trace;
using moe::monitor::TraceEvent;
using moe::monitor::TraceRow;

constexpr uint64_t kMs = 1000000;  // ns

TraceEvent host(const char* name, uint64_t thread, uint64_t from_ms, uint64_t to_ms) {
  return {name, false, thread, from_ms * kMs, to_ms * kMs};
}

TraceEvent kernel(const char* name, uint64_t stream, uint64_t from_ms, uint64_t to_ms) {
  return {name, true, stream, from_ms * kMs, to_ms * kMs};
}

TraceEvent step(uint64_t thread, uint64_t from_ms, uint64_t to_ms) {
  return {"ProfilerStep (outside operators)", false, thread, from_ms * kMs, to_ms * kMs, true};
}

const TraceRow& row(const std::vector<TraceRow>& rows, const std::string& name) {
  for (const auto& r : rows) {
    if (r.name == name) return r;
  }
  ADD_FAILURE() << "no row " << name;
  static const TraceRow none;
  return none;
}

TEST(TraceSummary, KernelsAreSortedIntoKindsByTheirCudaNames) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
       "cutlass::bfloat16_t>, true, false>(flash::Flash_fwd_params)",
       "attention"},
      {"fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
       "cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
       "attention"},
      {"cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"},
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
       "segment_k_off_kernel__5x_cublas",
       "gemm"},
      {"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"},
      {"void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::"
       "kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>>>>",
       "gemm"},
      {"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
       "namespace)::TensorListMetadata<5>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
       "<float, 5, (at::native::ADAM_MODE)1, false>, double*, double, double>",
       "optimizer"},
      {"void moe::kernels::(anonymous namespace)::adam8bit_step_kernel<float>(...)", "optimizer"},
      {"void moe::kernels::(anonymous namespace)::scatter_rows_kernel<c10::BFloat16, 2>(...)",
       "moe kernels"},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"},
      {"Memcpy HtoD (Pageable -> Device)", "copy"},
      {"Memset (Device)", "copy"},
      {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(...)",
       "norm"},
      {"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
       "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)",
       "loss"},
      {"void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
       "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>>>>(...)",
       "reduce"},
      {"void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<"
       "c10::BFloat16>, std::array<char*, 3ul>>(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
       "std::array<char*, 3ul>)",
       "elementwise"},
      {"void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
       "namespace)::OpaqueType<2u>, unsigned int, 3, 128, 1>(...)",
       "elementwise"},
      {"some_unknown_kernel", "other"},
  };
  for (const auto& [name, kind] : cases) EXPECT_EQ(kernel_kind(name), kind) << name;
}

TEST(TraceSummary, HostSelfTimeSubtractsNestedOperatorsPerThread) {
  // Thread 1: linear [0, 100) calls matmul [10, 40) (which calls mm [20, 30)) and add [50, 60).
  // Thread 2: an mm of its own, overlapping thread 1 in time but not nested in it.
  const auto s = summarize_trace({host("aten::linear", 1, 0, 100), host("aten::matmul", 1, 10, 40),
                                  host("aten::mm", 1, 20, 30), host("aten::add", 1, 50, 60),
                                  host("aten::mm", 2, 5, 45)});
  EXPECT_DOUBLE_EQ(row(s.host_ops, "aten::linear").ms, 60.0);
  EXPECT_DOUBLE_EQ(row(s.host_ops, "aten::matmul").ms, 20.0);
  EXPECT_DOUBLE_EQ(row(s.host_ops, "aten::mm").ms, 10.0 + 40.0);
  EXPECT_EQ(row(s.host_ops, "aten::mm").calls, 2);
  EXPECT_DOUBLE_EQ(row(s.host_ops, "aten::add").ms, 10.0);
  ASSERT_EQ(s.host_ops.size(), 4u);
  EXPECT_EQ(s.host_ops.front().name, "aten::linear");  // longest self time first
  EXPECT_TRUE(s.device_kernels.empty());
  EXPECT_DOUBLE_EQ(s.device_busy_ms, 0.0);
}

TEST(TraceSummary, DeviceBusyTimeIsTheUnionOfTheStreams) {
  // Two streams overlap on [5, 10); a gap [15, 20); then one more kernel.
  const char* gemm = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN";
  const char* nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
  const auto s = summarize_trace(
      {kernel(gemm, 7, 0, 10), kernel(nccl, 9, 5, 15), kernel(gemm, 7, 20, 30),
       kernel(gemm, 7, 22, 24) /* inside the one before: adds nothing to the busy time */});
  EXPECT_DOUBLE_EQ(s.device_busy_ms, 25.0);
  EXPECT_DOUBLE_EQ(row(s.device_kinds, "gemm").ms, 22.0);
  EXPECT_EQ(row(s.device_kinds, "gemm").calls, 3);
  EXPECT_DOUBLE_EQ(row(s.device_kinds, "nccl").ms, 10.0);
  EXPECT_EQ(s.device_kinds.front().name, "gemm");
  ASSERT_EQ(s.device_kernels.size(), 2u);
  EXPECT_EQ(s.device_kernels.front().name, gemm);
}

TEST(TraceSummary, TheTableShowsKernelsOnADeviceAndOperatorsOtherwise) {
  // Two steps of 50 ms; 40 ms of kernels in them.
  const auto gpu =
      summarize_trace({step(1, 0, 50), step(1, 60, 110), kernel("nvjet_tst_a", 7, 0, 30),
                       kernel("flash_fwd", 7, 60, 70), host("aten::mm", 1, 0, 50)});
  EXPECT_EQ(gpu.steps, 2);
  EXPECT_DOUBLE_EQ(gpu.wall_ms, 100.0);
  const std::string g = format_trace_summary(gpu, /*top=*/1);
  EXPECT_NE(g.find("2 step(s), 50.000 ms/step wall; device busy 20.000 ms/step (40.0% of the"),
            std::string::npos)
      << g;
  EXPECT_NE(g.find("15.000   75.0%       1  gemm"), std::string::npos) << g;
  EXPECT_NE(g.find("nvjet_tst_a"), std::string::npos) << g;
  EXPECT_EQ(g.find("flash_fwd"), std::string::npos) << "top = 1 shows one kernel\n" << g;
  EXPECT_EQ(g.find("aten::mm"), std::string::npos) << g;

  const auto cpu =
      summarize_trace({step(1, 0, 100), host("aten::mm", 1, 0, 50), host("aten::add", 1, 60, 70)});
  const std::string c = format_trace_summary(cpu, 5);
  EXPECT_NE(c.find("1 step(s), 100.000 ms/step wall; host operators by self time"),
            std::string::npos)
      << c;
  EXPECT_NE(c.find("50.000   50.0%       1  aten::mm"), std::string::npos) << c;
  EXPECT_NE(c.find("aten::add"), std::string::npos) << c;
  EXPECT_NE(c.find("40.000   40.0%       1  ProfilerStep (outside operators)"), std::string::npos)
      << "the step's host time in no operator\n"
      << c;
}

TEST(TraceSummary, OnlyWhatStartsInsideAStepCounts) {
  // Step 1 [0, 40], validation between the steps [40, 60], step 2 [60, 100].
  const auto s =
      summarize_trace({step(1, 0, 40), step(1, 60, 100), kernel("nvjet_tst_a", 7, 5, 35),
                       kernel("nvjet_tst_a", 7, 65, 95), kernel("validation_gemm", 7, 42, 58),
                       host("aten::mm", 1, 10, 20), host("evaluate", 1, 41, 59)});
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.wall_ms, 80.0);
  EXPECT_DOUBLE_EQ(s.device_busy_ms, 60.0);
  ASSERT_EQ(s.device_kernels.size(), 1u);
  EXPECT_EQ(s.device_kernels[0].calls, 2);
  for (const auto& r : s.host_ops) EXPECT_NE(r.name, "evaluate");
  EXPECT_DOUBLE_EQ(row(s.host_ops, "aten::mm").ms, 10.0);
}

TEST(TraceSummary, AnEventWithoutAnEndIsLeftOut) {
  const auto s = summarize_trace({{"aten::mm", false, 1, 10 * kMs, 5 * kMs}});
  EXPECT_TRUE(s.host_ops.empty());
  EXPECT_EQ(s.steps, 0);
  EXPECT_NE(format_trace_summary(s, 3).find("0 step(s), 0.000 ms/step wall"), std::string::npos);
}

}  // namespace
