// The config keys whose value is one of a closed set of names, as enums. Each enum's names are
// its JSON spelling, in the order "expected one of" messages and configs/schema.json list them.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

namespace moe::config {

enum class OptimizerType { kAdamW, kAdam };  // optimizer.type
enum class SchedulerType {                   // scheduler.type
  kWarmupLR,
  kWarmupDecayLR,
  kWarmupCosineLR,
  kLinearWarmupCosineDecay,
  kConstant
};
enum class WarmupType { kLog, kLinear };           // scheduler.params.warmup_type
enum class OffloadDevice { kNone, kCpu };          // zero_optimization.offload_optimizer.device
enum class ScoreFunction { kSoftmax, kSigmoid };   // moe.score_function
enum class TrainingDevice { kAuto, kCpu, kCuda };  // training.device
enum class OnFailure { kStop, kContinue };         // checkpoint.on_failure
// model.qk_norm_scope: over one head's width (Qwen3-MoE) or the whole projection (OLMoE).
enum class QkNormScope { kHead, kFull };
enum class MoeKernels { kAuto, kCuda, kReference };  // moe.kernels
enum class DistBackend { kAuto, kGloo, kNccl };      // distributed.backend
// model.attention_backend: which scaled-dot-product-attention kernel torch tries first on CUDA.
enum class AttentionBackend { kAuto, kFlash, kCudnn, kEfficient, kMath };
// model.rope_scaling.type: how rotary angles are stretched past the pretraining window (HF's
// rope_type; "none" is HF's "default").
enum class RopeScalingType { kNone, kLinear, kYarn };
// moe.dispatch_dtype: the dtype the routed rows move in (permute, expert-parallel all-to-all).
enum class DispatchDtype { kFp32, kCompute };
// moe.offload_experts: the frozen routed experts in host memory, fetched layer by layer (auto:
// where the plan says nothing else fits).
enum class OffloadExperts { kAuto, kOn, kOff };
// optimizer.exp_avg_dtype / exp_avg_sq_dtype: how Adam's moments are stored.
enum class StateDtype { kFp32, kBf16, k8Bit };
// training.param_dtype (the working weights) and optimizer.main_params_dtype (the master).
enum class ParamDtype { kFp32, kBf16, kFp16 };
// quantization.bnb_4bit_quant_type: bitsandbytes' 4-bit code books.
enum class Quant4bitType { kNf4, kFp4 };
// quantization.bnb_4bit_compute_dtype: what a 4-bit matrix is dequantized to before its GEMM
// (torch's dtype names, as transformers' BitsAndBytesConfig writes them into config.json).
enum class QuantComputeDtype { kFloat32, kBfloat16, kFloat16 };
// quantization.quant_method: bitsandbytes' 4-bit blocks over every frozen matrix (with
// load_in_4bit), or the routed experts in MXFP4 (gpt-oss's released format) with the rest 16-bit.
enum class QuantMethod { kBitsandbytes, kMxfp4 };
// moe.activation: the experts' gated activation: silu(gate) * up, or gpt-oss's clamped form
// (up + 1) * gate * sigmoid(alpha * gate) with gate <= limit and |up| <= limit.
// geglu (Gemma 4): gelu_tanh(gate) * up, in the experts, the shared expert and the dense MLPs.
enum class ExpertActivation { kSwiglu, kClampedSwiglu, kGeglu, kRelu2 };

template <class E>
struct ChoiceNames;  // kNames[i] is the JSON name of the enumerator with value i
template <>
struct ChoiceNames<StateDtype> {
  static constexpr std::array<std::string_view, 3> kNames = {"fp32", "bf16", "8bit"};
};
template <>
struct ChoiceNames<ParamDtype> {
  static constexpr std::array<std::string_view, 3> kNames = {"fp32", "bf16", "fp16"};
};
template <>
struct ChoiceNames<Quant4bitType> {
  static constexpr std::array<std::string_view, 2> kNames = {"nf4", "fp4"};
};
template <>
struct ChoiceNames<QuantComputeDtype> {
  static constexpr std::array<std::string_view, 3> kNames = {"float32", "bfloat16", "float16"};
};
template <>
struct ChoiceNames<ExpertActivation> {
  static constexpr std::array<std::string_view, 4> kNames = {"swiglu", "clamped_swiglu", "geglu",
                                                             "relu2"};
};
template <>
struct ChoiceNames<QuantMethod> {
  static constexpr std::array<std::string_view, 2> kNames = {"bitsandbytes", "mxfp4"};
};
template <>
struct ChoiceNames<OptimizerType> {
  static constexpr std::array<std::string_view, 2> kNames = {"AdamW", "Adam"};
};
template <>
struct ChoiceNames<SchedulerType> {
  static constexpr std::array<std::string_view, 5> kNames = {
      "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "LinearWarmupCosineDecay", "Constant"};
};
template <>
struct ChoiceNames<WarmupType> {
  static constexpr std::array<std::string_view, 2> kNames = {"log", "linear"};
};
template <>
struct ChoiceNames<OffloadDevice> {
  static constexpr std::array<std::string_view, 2> kNames = {"none", "cpu"};
};
template <>
struct ChoiceNames<ScoreFunction> {
  static constexpr std::array<std::string_view, 2> kNames = {"softmax", "sigmoid"};
};
template <>
struct ChoiceNames<TrainingDevice> {
  static constexpr std::array<std::string_view, 3> kNames = {"auto", "cpu", "cuda"};
};
template <>
struct ChoiceNames<OnFailure> {
  static constexpr std::array<std::string_view, 2> kNames = {"stop", "continue"};
};
template <>
struct ChoiceNames<QkNormScope> {
  static constexpr std::array<std::string_view, 2> kNames = {"head", "full"};
};
template <>
struct ChoiceNames<MoeKernels> {
  static constexpr std::array<std::string_view, 3> kNames = {"auto", "cuda", "reference"};
};
template <>
struct ChoiceNames<OffloadExperts> {
  static constexpr std::array<std::string_view, 3> kNames = {"auto", "on", "off"};
};
template <>
struct ChoiceNames<DispatchDtype> {
  static constexpr std::array<std::string_view, 2> kNames = {"fp32", "compute"};
};
template <>
struct ChoiceNames<DistBackend> {
  static constexpr std::array<std::string_view, 3> kNames = {"auto", "gloo", "nccl"};
};

template <>
struct ChoiceNames<RopeScalingType> {
  static constexpr std::array<std::string_view, 3> kNames = {"none", "linear", "yarn"};
};

template <>
struct ChoiceNames<AttentionBackend> {
  static constexpr std::array<std::string_view, 5> kNames = {"auto", "flash", "cudnn", "efficient",
                                                             "math"};
};

template <class E>
concept Choice = std::is_enum_v<E> && requires {
  ChoiceNames<E>::kNames;
};

template <Choice E>
constexpr std::string_view name(E e) {
  return ChoiceNames<E>::kNames[static_cast<std::size_t>(e)];
}

template <Choice E>
constexpr std::optional<E> parse_choice(std::string_view s) {
  for (std::size_t i = 0; i < ChoiceNames<E>::kNames.size(); ++i) {
    if (ChoiceNames<E>::kNames[i] == s) return static_cast<E>(i);
  }
  return std::nullopt;
}

// "AdamW, Adam": the tail of an "expected one of" message.
template <Choice E>
std::string choice_list() {
  std::string list;
  for (std::string_view n : ChoiceNames<E>::kNames) {
    list += (list.empty() ? "" : ", ") + std::string(n);
  }
  return list;
}

// Prints the JSON name (log lines and messages say "cpu", not 1).
template <Choice E>
std::ostream& operator<<(std::ostream& os, E e) {
  return os << name(e);
}

}  // namespace moe::config
