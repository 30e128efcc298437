#include "moe/hf/fp8_tensors.h"

#include <torch/torch.h>

#include "moe/hf/hf_tensor_map.h"
#include "moe/util/errors.h"

namespace moe::hf {

namespace {

constexpr const char* kScaleSuffix = "_scale_inv";

bool fp8_dtype(const std::string& d) { return d == "F8_E4M3" || d == "F8_E5M2"; }

}  // namespace

std::optional<quant::Fp8Block> fp8_format(const nlohmann::json& hf_config,
                                          const std::string& file) {
  const auto q = hf_config.find("quantization_config");
  if (q == hf_config.end() || !q->is_object() || q->value("quant_method", "") != "fp8") {
    return std::nullopt;
  }
  const std::string where = "hf: " + file + ": quantization_config.";
  // Static input scales (Mistral Small 4's release) are for FP8 compute: the import dequantizes
  // the weights and drops them (is_fp8_scale), as transformers' dequantize=True does.
  const auto scheme = q->find("activation_scheme");
  if (scheme != q->end() &&
      !(scheme->is_string() && (*scheme == "dynamic" || *scheme == "static"))) {
    throw UserError(where + "activation_scheme: " + scheme->dump() +
                    " (expected \"dynamic\" or \"static\")");
  }
  const auto b = q->find("weight_block_size");
  if (b == q->end() || b->is_null()) return quant::Fp8Block{};  // one scale per tensor
  const bool ok = b->is_array() && b->size() == 2 && (*b)[0].is_number_integer() &&
                  (*b)[1].is_number_integer() && (*b)[0].get<int64_t>() > 0 &&
                  (*b)[1].get<int64_t>() > 0 && (*b)[0].get<int64_t>() <= (1 << 20) &&
                  (*b)[1].get<int64_t>() <= (1 << 20);
  if (!ok) {
    throw UserError(where + "weight_block_size: " + b->dump() +
                    " (expected two positive integers, e.g. [128, 128])");
  }
  return quant::Fp8Block{{(*b)[0].get<int64_t>(), (*b)[1].get<int64_t>()}};
}

bool is_fp8_weight(const HfWeights& w, const std::string& name,
                   const std::optional<quant::Fp8Block>& format) {
  const HfTensorRef* ref = w.find(name);
  if (ref == nullptr || !fp8_dtype(ref->entry->dtype)) return false;
  const std::string where = "hf: " + ref->file->path() + ": tensor '" + name + "'";
  if (!format) {
    throw UserError(where + " is " + ref->entry->dtype +
                    " but config.json has no quantization_config with quant_method \"fp8\" "
                    "(its block size)");
  }
  const HfTensorRef* s = w.find(name + kScaleSuffix);
  if (s == nullptr) {
    throw UserError(where + " is " + ref->entry->dtype + " without its '" + name + kScaleSuffix +
                    "' (FP8 weights carry their scales)");
  }
  const auto want = quant::fp8_scale_shape(ref->entry->shape, *format);
  const auto& se = *s->entry;
  int64_t n = 1;
  for (const int64_t d : se.shape) n *= d;
  const bool shape_ok = *format
                            ? se.shape == want
                            : n == 1 || quant::fp8_per_slice_scales(ref->entry->shape, se.shape);
  if ((se.dtype != "F32" && se.dtype != "BF16") || !shape_ok) {
    throw UserError("hf: " + s->file->path() + ": tensor '" + name + kScaleSuffix + "' is " +
                    se.dtype + " " + shape_text(se.shape) + "; expected F32 or BF16 " +
                    (*format ? shape_text(want)
                             : std::string("with one value (or one per slice, dividing it)")) +
                    " for the " + shape_text(ref->entry->shape) + " weight" +
                    (*format ? " in blocks of " + std::to_string((*format)->first) + " x " +
                                   std::to_string((*format)->second)
                             : std::string()));
  }
  return true;
}

bool is_fp8_scale(const HfWeights& w, const std::string& name) {
  // NAME_scale_inv, and a static scheme's input scale: PREFIX.activation_scale of a linear's
  // PREFIX.weight, NAME_activation_scale of stacked experts' NAME.
  for (const auto& [suffix, base_suffix] : {std::pair<std::string, std::string>{kScaleSuffix, ""},
                                            {".activation_scale", ".weight"},
                                            {"_activation_scale", ""}}) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const HfTensorRef* base = w.find(name.substr(0, name.size() - suffix.size()) + base_suffix);
    if (base != nullptr && fp8_dtype(base->entry->dtype)) return true;
  }
  return false;
}

torch::Tensor read_fp8(const HfWeights& w, const std::string& name, const quant::Fp8Block& block,
                       torch::ScalarType dtype) {
  const torch::Tensor weight = read_hf_tensor(w.tensors().at(name));
  const torch::Tensor scale = read_hf_tensor(w.tensors().at(name + kScaleSuffix));
  return quant::dequantize_fp8_blockwise(weight, scale, block, dtype);
}

}  // namespace moe::hf
