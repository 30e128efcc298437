// LoRA adapters (Hu et al. 2021) in PEFT's layout and arithmetic: y = x W + s B(A(dropout(x))),
// s = lora_alpha / r (or / sqrt(r), rsLoRA). A is Kaiming-uniform, B zero, so a new adapter
// leaves the model's function unchanged. The base weight is never combined with B A during
// training: the adapter's two small GEMMs run beside the base GEMM (for experts, through the
// same grouped-GEMM offsets), and merge_into() folds them in only for an export.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace moe::layers {

class QuantizedWeight;
using QuantizedWeightPtr = std::shared_ptr<QuantizedWeight>;

struct LoraSpec {
  int64_t r = 0;  // 0: no adapters
  double scaling = 1.0;
  double dropout = 0.0;
};

// The adapter of one linear projection (PEFT's lora.Linear): lora_A [r, in], lora_B [out, r].
class LoraAdapterImpl : public torch::nn::Module {
 public:
  LoraAdapterImpl(int64_t in, int64_t out, const LoraSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);  // the update s B A x only
  torch::Tensor delta_weight() const;             // s B A: [out, in], nn.Linear's layout
  void zero_update();                             // B = 0: the adapter adds nothing
  torch::Tensor lora_A, lora_B;

 private:
  LoraSpec spec_;
};
TORCH_MODULE(LoraAdapter);

// One adapter per expert of a stacked [E, in, out] weight: lora_A [E, in, r], lora_B [E, r, out]
// (ours: x A B per expert, the grouped-GEMM layout; export-hf --adapter writes PEFT's).
class ExpertLoraImpl : public torch::nn::Module {
 public:
  ExpertLoraImpl(int64_t experts, int64_t in, int64_t out, const LoraSpec& spec);
  // Per-expert views of A and B for a loop over experts: unbind, whose backward stacks the
  // slices into one gradient (E selects would each build a zero-filled [E, ...] gradient).
  struct Slices {
    std::vector<torch::Tensor> A, B;
  };
  Slices slices() const { return {lora_A.unbind(0), lora_B.unbind(0)}; }
  // The update for rows `x` that all belong to expert `e`.
  torch::Tensor forward_expert(const torch::Tensor& x, const Slices& s, int64_t e);
  // The update for expert-ordered rows in bf16 with group ends `offs` (at::_grouped_mm).
  torch::Tensor forward_grouped(const torch::Tensor& x_bf16, const torch::Tensor& offs);
  torch::Tensor delta_weight() const;  // s A B: [E, in, out]
  void zero_update();
  int64_t rank() const { return spec_.r; }
  torch::Tensor lora_A, lora_B;

 private:
  torch::Tensor dropped(const torch::Tensor& x);
  LoraSpec spec_;
};
TORCH_MODULE(ExpertLora);

// The frozen base of a LoRA model: every parameter that does not train (not an adapter, not in
// lora.modules_to_save). A fingerprint of their values (XXH3 over names, shapes and fp32 bytes,
// in module order), taken right after the base is loaded: a LoRA checkpoint records it and
// refuses a different base.
// `held`: the dtype the frozen base matrices are held in (base_dtype()); the fingerprint hashes
// each frozen value as that dtype holds it, so a CPU export (fp32 base) checks a checkpoint of a
// GPU run (bf16 base) by rounding its fp32 values the same way.
// `quantized`: a 4-bit base's matrices by parameter name (their parameters are empty): their
// codes and statistics are hashed in place of the values.
std::string base_fingerprint(const torch::nn::Module& model, torch::ScalarType held = torch::kFloat,
                             const std::map<std::string, QuantizedWeightPtr>& quantized = {});

// The parameters a 16-bit model holds in its compute dtype: the matrices (projections, experts,
// embeddings, head); norms and routers stay fp32.
bool is_16bit_matrix(const std::string& name, const torch::Tensor& param);
// Whether a frozen base parameter lives in the 16-bit compute dtype under LoRA on a GPU.
bool held_in_16_bits(const std::string& name, const torch::Tensor& param);

// The parameters that train (all of them without LoRA): what the optimizer, the gradient
// reduction and ZeRO's partition see. In module order, with their names.
std::vector<std::pair<std::string, torch::Tensor>> trainable_parameters(
    const torch::nn::Module& model);

}  // namespace moe::layers
