// The planner's bytes per trained parameter for each optimizer-state tier (docs/memory.md's
// table): Adam's moments at 4 / 2 / 1 + 4/256 bytes each, on the device or, offloaded, on the
// host with the master copy and gradient staging.
#include <gtest/gtest.h>

#include <cstdio>

#include "../config/config_test_util.h"
#include "moe/config/lora.h"
#include "moe/plan/memory_plan.h"
#include "moe/plan/plan_report.h"
#include "moe/plan/quantized_base_tier.h"
#include "moe/plan/weights_tier.h"

namespace moe::plan {
namespace {

using namespace moe::config;  // NOLINT(google-build-using-namespace): the config's types

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

// bitsandbytes' bytes of one 4-bit matrix: ceil(n / 2) code bytes; an fp32 absmax per 64 values,
// or (double quant) a uint8 one with an fp32 scale per 256 blocks and an fp32 offset.
TEST(MemoryPlanQlora, FourBitBytesOfOneMatrix) {
  EXPECT_EQ(quantized_4bit_bytes(1, false), 1 + 4);
  EXPECT_EQ(quantized_4bit_bytes(1, true), 1 + 1 + 4 + 4);
  EXPECT_EQ(quantized_4bit_bytes(5184, false), 2592 + 4 * 81);
  EXPECT_EQ(quantized_4bit_bytes(5184, true), 2592 + 81 + 4 + 4);
  EXPECT_EQ(quantized_4bit_bytes(2592, false), 1296 + 4 * 41);  // 40.5 blocks: 41
  EXPECT_EQ(quantized_4bit_bytes(2592, true), 1296 + 41 + 4 + 4);
  // 4096 blocks: 16 nested scales.
  EXPECT_EQ(quantized_4bit_bytes(262144, true), 131072 + 4096 + 4 * 16 + 4);
}

// A small Qwen3-MoE-like LoRA config: hidden 72, 4 heads of 18 (2 key-value heads), a dense
// first layer (MLP width 56) and a MoE layer of 4 experts of width 40.
nlohmann::json small_qlora(bool double_quant) {
  nlohmann::json j = test_util::minimal();
  j["bf16"] = {{"enabled", true}};
  j["train_micro_batch_size_per_gpu"] = 1;
  j["model"] = {{"hidden_size", 72},        {"num_layers", 2},        {"num_heads", 4},
                {"num_key_value_heads", 2}, {"vocab_size", 256},      {"seq_len", 32},
                {"tie_embeddings", false},  {"dense_hidden_size", 56}};
  j["moe"] = {
      {"num_experts", 4}, {"top_k", 2}, {"expert_hidden_size", 40}, {"mlp_only_layers", {0}}};
  j["lora"] = {{"r", 8}, {"lora_alpha", 16}};
  j["quantization"] = {{"load_in_4bit", true},
                       {"bnb_4bit_quant_type", "nf4"},
                       {"bnb_4bit_use_double_quant", double_quant},
                       {"bnb_4bit_compute_dtype", "bfloat16"}};
  return j;
}

// The 4-bit base is the sum over the matrices the model quantizes, each with its own blocks:
// per layer q [72, 72], k and v [36, 72] each, o [72, 72]; layer 0's gate, up [56, 72] and down
// [72, 56]; layer 1's 4 experts' gate, up and down [40, 72] / [72, 40].
TEST(MemoryPlanQlora, FourBitBaseIsTheHandSumOverMatrices) {
  const double q = 5184, kv = 2592, dense = 4032, expert = 2880;
  const double params = 2 * (2 * q + 2 * kv) + 3 * dense + 12 * expert;
  struct Case {
    bool dq;
    double bytes;
  };
  // no double quant: n / 2 + 4 ceil(n / 64); double quant: n / 2 + ceil(n / 64) + 4 + 4.
  for (const Case& t : {Case{false, 2 * (2 * (2592 + 4 * 81) + 2 * (1296 + 4 * 41)) +
                                        3 * (2016 + 4 * 63) + 12 * (1440 + 4 * 45)},
                        Case{true, 2 * (2 * (2592 + 81 + 8) + 2 * (1296 + 41 + 8)) +
                                       3 * (2016 + 63 + 8) + 12 * (1440 + 45 + 8)}}) {
    const Config c = test_util::build(small_qlora(t.dq));
    const Quantized4bitBase base = quantized_4bit_base(c, PlanOptions{});
    EXPECT_EQ(static_cast<double>(base.parameters), params);
    EXPECT_EQ(base.matrices, 2 * 4 + 3 + 12);
    EXPECT_DOUBLE_EQ(base.bytes, t.bytes) << (t.dq ? "double quant" : "no double quant");
    const MemoryPlan p = plan_memory(c, PlanOptions{});
    EXPECT_DOUBLE_EQ(p.quantized_base, t.bytes);
    EXPECT_EQ(static_cast<double>(p.quantized_parameters), params);
    // The rest of the frozen base (embeddings, head, norms, routers) stays 16-bit; the adapters
    // are fp32 (training.param_dtype).
    const LoraParameterCounts n = lora_parameter_counts(c);
    EXPECT_DOUBLE_EQ(p.weights, 4 * static_cast<double>(n.adapter + n.trainable_base) +
                                    2 * (static_cast<double>(n.frozen_base) - params) + t.bytes);
    // On a GPU with bf16 the experts dequantize a whole stack [4, 40, 72] to bf16 at once; the
    // fused q|k|v [144, 72] in the compute dtype (bf16) is smaller.
    EXPECT_DOUBLE_EQ(p.dequant_scratch, 4 * expert * 2);
    // On a CPU each expert's matrix alone: the fused q|k|v is the largest group.
    EXPECT_DOUBLE_EQ(plan_memory(c, PlanOptions{.cpu = true}).dequant_scratch, 144 * 72 * 2);
  }
}

// Against the 16-bit base: the weights fall by 2 B less the 4-bit bytes per quantized parameter,
// which are 0.5625 B without double quant and under 0.53 B with it; the scratch is added to the
// peak.
TEST(MemoryPlanQlora, FourBitBaseFallsFromTheBf16Base) {
  for (bool dq : {false, true}) {
    const Config c4 = test_util::build(small_qlora(dq));
    Config c16 = c4;
    c16.quantization.load_in_4bit = false;
    const MemoryPlan p4 = plan_memory(c4, PlanOptions{});
    const MemoryPlan p16 = plan_memory(c16, PlanOptions{});
    EXPECT_EQ(p16.quantized_parameters, 0);
    EXPECT_EQ(p16.dequant_scratch, 0);
    const double n = static_cast<double>(p4.quantized_parameters);
    EXPECT_DOUBLE_EQ(p16.weights - p4.weights, 2 * n - p4.quantized_base);
    const double per = p4.quantized_base / n;
    if (dq) {
      EXPECT_LE(per, 0.53);
      EXPECT_GE(per, 0.5 + 1.0 / 64);
    } else {
      EXPECT_NEAR(per, 0.5 + 4.0 / 64, 1e-3);  // ceil of the 36-row matrices' blocks
    }
    EXPECT_DOUBLE_EQ(p4.peak - p16.peak, p4.dequant_scratch - (2 * n - p4.quantized_base));
  }
}

// 12 layers of 64 experts (the first dense): a base of ~2 GiB in bf16.
void widen(nlohmann::json& j) {
  j["model"]["hidden_size"] = 1024;
  j["model"]["num_layers"] = 12;
  j["model"]["num_heads"] = 8;
  j["model"]["num_key_value_heads"] = 4;
  j["model"]["dense_hidden_size"] = 2048;
  j["moe"]["num_experts"] = 64;
  j["moe"]["expert_hidden_size"] = 512;
}

// A LoRA plan whose bf16 base does not fit is told the 4-bit base that does, with its figure.
TEST(MemoryPlanQlora, AdviceOffersTheFourBitBaseWhenTheBf16BaseDoesNotFit) {
  nlohmann::json j = small_qlora(true);
  widen(j);
  const Config c4 = test_util::build(j);
  Config c16 = c4;
  c16.quantization = QuantizationConfig{};
  // With the expert offload tier left at auto the plan would take it instead (next test).
  c16.moe.offload_experts = config::OffloadExperts::kOff;
  const double r4 = plan_memory(c4, PlanOptions{}).reserved;
  const double r16 = plan_memory(c16, PlanOptions{}).reserved;
  ASSERT_LT(r4 + (1 << 30), r16);  // 11 layers of 64 experts: ~2.1 GiB of base against ~0.6
  const MemoryPlan p = plan_memory(c16, PlanOptions{.device_bytes = (r4 + r16) / 2});
  EXPECT_FALSE(p.fits);
  bool offered = false;
  for (const auto& a : p.advice) {
    if (a.find("4-bit base (quantization.load_in_4bit, nf4 + double quant)") == std::string::npos)
      continue;
    offered = true;
    char figure[32];
    std::snprintf(figure, sizeof figure, "%.2f GiB", r4 / (1024.0 * 1024 * 1024));
    EXPECT_NE(a.find(figure), std::string::npos) << a;
  }
  EXPECT_TRUE(offered) << format_plan(c16, PlanOptions{.device_bytes = (r4 + r16) / 2}, p);
  // Fitting as it is, or already 4-bit: no such advice.
  for (const MemoryPlan& q : {plan_memory(c16, PlanOptions{.device_bytes = 2 * r16}),
                              plan_memory(c4, PlanOptions{.device_bytes = (r4 + r16) / 2})}) {
    for (const auto& a : q.advice) EXPECT_EQ(a.find("4-bit base"), std::string::npos) << a;
  }
}

// moe.offload_experts: `on` moves every MoE layer's frozen experts (bf16 here) to the host and
// puts a ring of two layers on the device; `auto` takes it only where the run does not fit.
TEST(MemoryPlanExpertOffload, MovesTheFrozenExpertsAndAutoTakesItWhereNothingElseFits) {
  nlohmann::json j = small_qlora(false);
  j.erase("quantization");  // a bf16 base
  widen(j);
  Config off = test_util::build(j);
  off.moe.offload_experts = config::OffloadExperts::kOff;
  Config on = off;
  on.moe.offload_experts = config::OffloadExperts::kOn;
  const MemoryPlan p_off = plan_memory(off, PlanOptions{});
  const MemoryPlan p_on = plan_memory(on, PlanOptions{});
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < off.model.num_layers; ++i) moe_layers += is_moe_layer(off, i) ? 1 : 0;
  const double per_layer = 2.0 * 3 * 64 * 1024 * 512;  // gate, up, down of 64 experts in bf16
  ASSERT_TRUE(p_on.expert_offload.on);
  EXPECT_FALSE(p_off.expert_offload.on);
  EXPECT_EQ(p_on.expert_offload.layers, moe_layers);
  EXPECT_DOUBLE_EQ(p_on.expert_offload.host_bytes, moe_layers * per_layer);
  EXPECT_DOUBLE_EQ(p_on.expert_offload.ring_bytes, 2 * per_layer);
  EXPECT_DOUBLE_EQ(p_off.weights - p_on.weights, (moe_layers - 2) * per_layer);
  EXPECT_DOUBLE_EQ(p_on.host - p_off.host, moe_layers * per_layer);
  // Forward and backward copy every layer but the one the ring holds at the turn.
  const double micro = static_cast<double>(off.gradient_accumulation_steps);
  EXPECT_DOUBLE_EQ(p_on.expert_offload.copy_bytes_per_step,
                   micro * (2 * moe_layers - 1) * per_layer);
  // auto: as configured where that fits, the tier where only it fits.
  Config automatic = off;
  automatic.moe.offload_experts = config::OffloadExperts::kAuto;
  const double between = (p_on.reserved + p_off.reserved) / 2;
  const MemoryPlan roomy = plan_memory(automatic, PlanOptions{.device_bytes = 2 * p_off.reserved});
  const MemoryPlan tight = plan_memory(automatic, PlanOptions{.device_bytes = between});
  EXPECT_FALSE(roomy.expert_offload.on);
  EXPECT_TRUE(tight.expert_offload.on && tight.expert_offload.chosen_by_auto && tight.fits);
  EXPECT_DOUBLE_EQ(tight.reserved, plan_memory(on, PlanOptions{.device_bytes = between}).reserved);
}

// Where nothing fits, the plan names the two closest options with their figures: LoRA on a
// 4-bit base, and expert parallelism over the most GPUs the experts allow (DeepSeek-V3 on 141 GiB).
TEST(MemoryPlanAdvice, NothingFitsNamesTheNearestOptionsWithTheirFigures) {
  nlohmann::json j = small_qlora(true);
  j["model"]["num_layers"] = 4;
  j["moe"]["num_experts"] = 8;
  j.erase("quantization");
  const Config c = test_util::build(j);
  const PlanOptions tiny{.device_bytes = 1 << 20};
  const MemoryPlan p = plan_memory(c, tiny);
  ASSERT_FALSE(p.fits);
  ASSERT_TRUE(p.advice.empty()) << format_plan(c, tiny, p);
  ASSERT_EQ(p.nearest.size(), 2u) << format_plan(c, tiny, p);
  auto figure = [&](double bytes) {  // the need as a multiple of the device, as printed
    char f[48];
    std::snprintf(f, sizeof f, "%.1fx this device", bytes / tiny.device_bytes);
    return std::string(f);
  };
  Config q4 = c;
  q4.quantization.load_in_4bit = true;
  q4.quantization.quant_method = QuantMethod::kBitsandbytes;
  q4.quantization.bnb_4bit_quant_type = Quant4bitType::kNf4;
  q4.quantization.bnb_4bit_use_double_quant = true;
  q4.quantization.bnb_4bit_compute_dtype = QuantComputeDtype::kBfloat16;
  const double r4 = plan_memory(q4, PlanOptions{.checkpointing = true}).reserved;
  EXPECT_NE(p.nearest[0].find("4-bit base"), std::string::npos) << p.nearest[0];
  EXPECT_NE(p.nearest[0].find(figure(r4)), std::string::npos) << p.nearest[0] << " vs " << r4;
  Config ep = c;
  ep.lora.r = 0;
  ep.bf16.enabled = true;
  ep.zero_optimization.stage = std::max<int64_t>(ep.zero_optimization.stage, 1);
  ep.moe.expert_parallel_size = 8;
  const double r8 = plan_memory(ep, PlanOptions{.world_size = 8, .checkpointing = true}).reserved;
  EXPECT_EQ(p.nearest[1].rfind("8 GPUs with expert parallelism", 0), 0u) << p.nearest[1];
  EXPECT_NE(p.nearest[1].find(figure(r8)), std::string::npos) << p.nearest[1] << " vs " << r8;
  // A plan that fits, or has advice, has no nearest options.
  EXPECT_TRUE(plan_memory(c, PlanOptions{.device_bytes = 4 * r4}).nearest.empty());
}

}  // namespace
}  // namespace moe::plan
