// The planner's bytes per trained parameter for each optimizer-state tier (docs/memory.md's
// table): Adam's moments at 4 / 2 / 1 + 4/256 bytes each, on the device or, offloaded, on the
// host with the master copy and gradient staging.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "moe/config/memory_plan.h"

namespace moe::config {
namespace {

TEST(MemoryPlanTiers, MomentBytesPerParameterFollowTheFormula) {
  Config c = test_util::build(test_util::minimal());
  struct Tier {
    StateDtype m, v;
    double bytes;
  };
  const double eight = 1.0 + 4.0 / 256;
  for (const Tier& t : {Tier{StateDtype::kFp32, StateDtype::kFp32, 8.0},
                        Tier{StateDtype::kBf16, StateDtype::kBf16, 4.0},
                        Tier{StateDtype::kBf16, StateDtype::k8Bit, 2.0 + eight},
                        Tier{StateDtype::k8Bit, StateDtype::k8Bit, 2 * eight}}) {
    c.optimizer.exp_avg_dtype = t.m;
    c.optimizer.exp_avg_sq_dtype = t.v;
    EXPECT_DOUBLE_EQ(moment_bytes_per_parameter(c), t.bytes);
    PlanOptions cpu{.cpu = true};
    const MemoryPlan p = plan_memory(c, cpu);
    const double params = static_cast<double>(p.parameters);
    EXPECT_DOUBLE_EQ(p.optimizer_states, t.bytes * params);
    EXPECT_DOUBLE_EQ(p.weights + p.gradients + p.optimizer_states, (8 + t.bytes) * params);
    EXPECT_EQ(p.update_transient > 0, t.bytes != 8.0);
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    const MemoryPlan off = plan_memory(c, cpu);
    EXPECT_EQ(off.optimizer_states, 0);
    EXPECT_DOUBLE_EQ(off.host, (t.bytes + 8) * params + off.update_transient);
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kNone;
  }
}

// The fused SwiGLU keeps gate and up (and the product) per FFN row, the ATen reference silu(gate)
// too: a GPU plan counts the reference where moe.kernels says so or the build has no kernels.
TEST(MemoryPlanKernels, ReferenceSwigluKeepsOneTensorMorePerFfnRow) {
  Config c = test_util::build(test_util::minimal());
  c.bf16.enabled = true;
  const MemoryPlan fused = plan_memory(c, PlanOptions{});
  const MemoryPlan no_kernels = plan_memory(c, PlanOptions{.cuda_kernels = false});
  c.moe.kernels = MoeKernels::kReference;
  const MemoryPlan reference = plan_memory(c, PlanOptions{});
  EXPECT_GT(no_kernels.activations, fused.activations);
  EXPECT_DOUBLE_EQ(no_kernels.activations, reference.activations);
  // One 2-byte tensor of [tokens, k, f] per MoE layer.
  const double rows = static_cast<double>(fused.micro_batch * c.model.seq_len * c.moe.top_k);
  EXPECT_DOUBLE_EQ(reference.activations - fused.activations,
                   static_cast<double>(c.model.num_layers) * rows *
                       static_cast<double>(expert_hidden_size(c)) * 2);
}

// Device bytes per trained parameter of each working-weight tier (docs/memory.md's table):
// weights + gradients + master + moments.
TEST(MemoryPlanTiers, WorkingWeightBytesPerParameterFollowTheFormula) {
  Config c = test_util::build(test_util::minimal());
  c.bf16.enabled = true;
  struct Tier {
    ParamDtype weights, master;
    int64_t accumulation;
    bool offload;
    bool streamed;                    // offload with overlap_comm: gradients copied in the backward
    double device_bytes, host_bytes;  // per parameter, fp32 moments
  };
  for (const Tier& t : {
           Tier{ParamDtype::kFp32, ParamDtype::kFp32, 1, false, false, 4 + 4 + 8, 0},
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 1, false, false, 2 + 2 + 4 + 8, 0},
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 4, false, false, 2 + 4 + 4 + 8, 0},
           Tier{ParamDtype::kBf16, ParamDtype::kBf16, 1, false, false, 2 + 2 + 2 + 8, 0},
           // Streamed: 16-bit gradients leave the device as they are made; the host keeps
           // fp32 gradients (summed there) and a 16-bit staging buffer.
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 1, true, true, 2, 8 + 4 + 4 + 2},
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 4, true, true, 2, 8 + 4 + 4 + 2},
           Tier{ParamDtype::kFp32, ParamDtype::kFp32, 1, true, true, 4 + 4, 8 + 4 + 4},
           // Copied after the backward (overlap_comm false): staging in the gradients' dtype.
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 1, true, false, 2 + 2, 8 + 4 + 2},
           Tier{ParamDtype::kBf16, ParamDtype::kFp32, 4, true, false, 2 + 4, 8 + 4 + 4},
           Tier{ParamDtype::kFp32, ParamDtype::kFp32, 1, true, false, 4 + 4, 8 + 4 + 4},
       }) {
    c.training.param_dtype = t.weights;
    c.optimizer.main_params_dtype = t.master;
    c.gradient_accumulation_steps = t.accumulation;
    c.zero_optimization.offload_optimizer.device =
        t.offload ? OffloadDevice::kCpu : OffloadDevice::kNone;
    c.zero_optimization.overlap_comm = t.streamed || !t.offload;
    const MemoryPlan p = plan_memory(c, PlanOptions{.cpu = true});
    const double params = static_cast<double>(p.parameters);
    EXPECT_DOUBLE_EQ(p.weights + p.gradients + p.master_weights + p.optimizer_states,
                     t.device_bytes * params)
        << name(t.weights) << " weights, " << name(t.master) << " master, accumulation "
        << t.accumulation << (t.offload ? ", offload" : "") << (t.streamed ? " streamed" : "");
    // Under 16-bit weights the norms and routers stay fp32: 16 B each on the host (moments,
    // master and an fp32 gradient or staging; no 16-bit copy).
    const double held = t.weights == ParamDtype::kFp32
                            ? 0
                            : static_cast<double>(fp32_parameters_under_16bit_weights(c));
    EXPECT_DOUBLE_EQ(p.host - (t.offload ? p.update_transient : 0),
                     t.host_bytes * (params - held) + (t.offload ? 16 * held : 0));
    EXPECT_EQ(p.low_precision_weights, 0);  // a CPU plan: no autocast copies
  }
}

}  // namespace
}  // namespace moe::config
