#include "moe/layers/lora.h"

#include <cmath>

#include <torch/torch.h>

#include "moe/config/lora.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/util/content_hash.h"

namespace moe::layers {

namespace {

// nn.Linear's (and PEFT's) default for lora_A: kaiming_uniform_(a = sqrt(5)), i.e.
// uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)).
torch::Tensor kaiming_uniform(torch::IntArrayRef shape, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return torch::empty(shape).uniform_(-bound, bound);
}

}  // namespace

LoraAdapterImpl::LoraAdapterImpl(int64_t in, int64_t out, const LoraSpec& spec) : spec_(spec) {
  lora_A = register_parameter("lora_A", kaiming_uniform({spec.r, in}, in));
  lora_B = register_parameter("lora_B", torch::zeros({out, spec.r}));
}

torch::Tensor LoraAdapterImpl::forward(const torch::Tensor& x) {
  auto in = spec_.dropout > 0 ? torch::dropout(x, spec_.dropout, is_training()) : x;
  return torch::nn::functional::linear(torch::nn::functional::linear(in, lora_A), lora_B) *
         spec_.scaling;
}

torch::Tensor LoraAdapterImpl::delta_weight() const {
  return lora_B.matmul(lora_A) * spec_.scaling;
}

void LoraAdapterImpl::zero_update() {
  torch::NoGradGuard g;
  lora_B.zero_();
}

ExpertLoraImpl::ExpertLoraImpl(int64_t experts, int64_t in, int64_t out, const LoraSpec& spec)
    : spec_(spec) {
  lora_A = register_parameter("lora_A", kaiming_uniform({experts, in, spec.r}, in));
  lora_B = register_parameter("lora_B", torch::zeros({experts, spec.r, out}));
}

torch::Tensor ExpertLoraImpl::dropped(const torch::Tensor& x) {
  return spec_.dropout > 0 ? torch::dropout(x, spec_.dropout, is_training()) : x;
}

torch::Tensor ExpertLoraImpl::forward_expert(const torch::Tensor& x, const Slices& s, int64_t e) {
  const auto i = static_cast<size_t>(e);
  return dropped(x).matmul(s.A[i]).matmul(s.B[i]) * spec_.scaling;
}

torch::Tensor ExpertLoraImpl::forward_grouped(const torch::Tensor& x_bf16,
                                              const torch::Tensor& offs) {
  const auto xa = at::_grouped_mm(dropped(x_bf16), lora_A.to(torch::kBFloat16), offs);
  return at::_grouped_mm(xa, lora_B.to(torch::kBFloat16), offs) * spec_.scaling;
}

torch::Tensor ExpertLoraImpl::delta_weight() const {
  return torch::bmm(lora_A, lora_B) * spec_.scaling;
}

void ExpertLoraImpl::zero_update() {
  torch::NoGradGuard g;
  lora_B.zero_();
}

bool is_16bit_matrix(const std::string& name, const torch::Tensor& param) {
  return param.dim() >= 2 && name.find(".router.") == std::string::npos;
}

bool held_in_16_bits(const std::string& name, const torch::Tensor& param) {
  return !param.requires_grad() && is_16bit_matrix(name, param);
}

std::string base_fingerprint(const torch::nn::Module& model, torch::ScalarType held,
                             const std::map<std::string, QuantizedWeightPtr>& quantized) {
  ContentHash h;
  auto hash_bytes = [&](const torch::Tensor& t) {
    const auto c = t.to(torch::kCPU).contiguous();
    h.update(c.data_ptr(), static_cast<size_t>(c.nbytes()));
  };
  for (const auto& item : model.named_parameters()) {
    // what trains (adapters, lora.modules_to_save) is the checkpoint's, not the base's
    if (item.value().requires_grad()) continue;
    if (const auto q = quantized.find(item.key()); q != quantized.end()) {
      h.update(item.key() + ":4bit");  // never equal to a 16-bit base's
      for (const int64_t s : q->second->shape()) h.update(&s, sizeof s);
      if (q->second->is_mxfp4()) {
        h.update(std::string(":mxfp4"));
        hash_bytes(q->second->mxfp4_blocks());
        hash_bytes(q->second->mxfp4_scales());
      }
      for (const auto& part : q->second->parts()) {
        hash_bytes(part.codes);
        hash_bytes(part.absmax);
        if (part.double_quant()) {
          hash_bytes(part.nested_absmax);
          hash_bytes(part.offset);
        }
      }
      continue;
    }
    auto t = item.value().detach();
    if (held_in_16_bits(item.key(), t)) t = t.to(held);  // a no-op where it is held so
    t = t.to(torch::kCPU, torch::kFloat).contiguous();
    h.update(item.key());
    for (const int64_t s : t.sizes()) h.update(&s, sizeof s);
    h.update(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  return h.hex();
}

std::vector<std::pair<std::string, torch::Tensor>> trainable_parameters(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace moe::layers
