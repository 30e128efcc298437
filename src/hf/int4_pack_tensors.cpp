#include "moe/hf/int4_pack_tensors.h"

#include <torch/torch.h>

#include "moe/hf/hf_tensor_map.h"
#include "moe/util/errors.h"

namespace moe::hf {

namespace {

const char* const kParts[] = {"_packed", "_scale", "_shape"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One config group's "weights" scheme: symmetric 4-bit integers in groups along the input.
int64_t group_size_of(const nlohmann::json& weights, const std::string& where) {
  const auto is = [&](const char* key, const nlohmann::json& want) {
    return weights.contains(key) && weights[key] == want;
  };
  if (!is("num_bits", 4) || !is("type", "int")) {
    throw UserError(where +
                    "num_bits / type: " + weights.value("num_bits", nlohmann::json()).dump() +
                    " / " + weights.value("type", nlohmann::json()).dump() +
                    " is not supported (expected 4-bit \"int\": Kimi-K2's INT4 experts)");
  }
  if (!is("symmetric", true)) {
    throw UserError(where + "symmetric: false is not supported (zero points; expected true)");
  }
  if (!is("strategy", "group")) {
    throw UserError(where + "strategy: " + weights.value("strategy", nlohmann::json()).dump() +
                    " is not supported (expected \"group\")");
  }
  const auto actorder = weights.find("actorder");
  if (actorder != weights.end() && !actorder->is_null() && *actorder != "static") {
    throw UserError(where + "actorder: " + actorder->dump() +
                    " is not supported (a permuted group order; expected null or \"static\")");
  }
  const auto g = weights.find("group_size");
  if (g == weights.end() || !g->is_number_integer() || g->get<int64_t>() <= 0 ||
      g->get<int64_t>() > (1 << 20)) {
    throw UserError(where + "group_size: expected a positive integer, e.g. 32");
  }
  return g->get<int64_t>();
}

}  // namespace

std::optional<PackQuantized> pack_quantized_format(const nlohmann::json& hf_config,
                                                   const std::string& file) {
  const auto q = hf_config.find("quantization_config");
  if (q == hf_config.end() || !q->is_object() ||
      q->value("quant_method", "") != "compressed-tensors") {
    return std::nullopt;
  }
  const std::string where = "hf: " + file + ": quantization_config.";
  if (q->value("format", "") != "pack-quantized") {
    throw UserError(where + "format: " + q->value("format", nlohmann::json()).dump() +
                    " is not supported (compressed-tensors \"pack-quantized\" INT4 is)");
  }
  const auto groups = q->find("config_groups");
  if (groups == q->end() || !groups->is_object() || groups->empty()) {
    throw UserError(where + "config_groups: expected an object of quantization schemes");
  }
  std::optional<int64_t> group_size;
  for (const auto& [name, scheme] : groups->items()) {
    const std::string at = where + "config_groups." + name + ".";
    if (!scheme.is_object() || !scheme.contains("weights") || !scheme["weights"].is_object()) {
      throw UserError(at + "weights: expected the weights' scheme (an object)");
    }
    const auto acts = scheme.find("input_activations");
    if (acts != scheme.end() && !acts->is_null()) {
      throw UserError(at +
                      "input_activations: activation quantization is not supported "
                      "(expected null: the import dequantizes the weights)");
    }
    const int64_t g = group_size_of(scheme["weights"], at + "weights.");
    if (group_size && *group_size != g) {
      throw UserError(at + "weights.group_size: " + std::to_string(g) +
                      " differs from another group's " + std::to_string(*group_size));
    }
    group_size = g;
  }
  return PackQuantized{*group_size};
}

std::optional<std::vector<int64_t>> pack_quantized_shape(
    const HfWeights& w, const std::string& name, const std::optional<PackQuantized>& format) {
  const HfTensorRef* packed = w.find(name + "_packed");
  if (packed == nullptr) return std::nullopt;
  const std::string where = "hf: " + packed->file->path() + ": tensor '" + name + "_packed'";
  if (!format) {
    throw UserError(where +
                    " is pack-quantized but config.json has no quantization_config "
                    "with quant_method \"compressed-tensors\", format \"pack-quantized\"");
  }
  const HfTensorRef* scale = w.find(name + "_scale");
  const HfTensorRef* shape = w.find(name + "_shape");
  for (const auto& [ref, part] : {std::pair{scale, "_scale"}, std::pair{shape, "_shape"}}) {
    if (ref == nullptr) {
      throw UserError(where + " comes without its '" + name + part +
                      "' (pack-quantized weights carry their scales and shape)");
    }
  }
  const auto& se = *shape->entry;
  if ((se.dtype != "I64" && se.dtype != "I32") || se.shape != std::vector<int64_t>{2}) {
    throw UserError("hf: " + shape->file->path() + ": tensor '" + name + "_shape' is " + se.dtype +
                    " " + shape_text(se.shape) + "; expected I64 or I32 [2]");
  }
  const auto dims = read_hf_tensor(*shape).to(torch::kLong);
  const int64_t out = dims[0].item<int64_t>(), in = dims[1].item<int64_t>();
  const int64_t g = format->group_size;
  if (out <= 0 || in <= 0 || in % 8 != 0 || in % g != 0) {
    throw UserError("hf: " + shape->file->path() + ": tensor '" + name + "_shape' says [" +
                    std::to_string(out) + ", " + std::to_string(in) +
                    "]; expected positive sizes, the second a multiple of 8 and of group_size " +
                    std::to_string(g));
  }
  const auto& pe = *packed->entry;
  if (pe.dtype != "I32" || pe.shape != std::vector<int64_t>{out, in / 8}) {
    throw UserError(where + " is " + pe.dtype + " " + shape_text(pe.shape) + "; expected I32 " +
                    shape_text({out, in / 8}) + " for the [" + std::to_string(out) + ", " +
                    std::to_string(in) + "] weight");
  }
  const auto& ce = *scale->entry;
  if ((ce.dtype != "BF16" && ce.dtype != "F16" && ce.dtype != "F32") ||
      ce.shape != std::vector<int64_t>{out, in / g}) {
    throw UserError("hf: " + scale->file->path() + ": tensor '" + name + "_scale' is " + ce.dtype +
                    " " + shape_text(ce.shape) + "; expected BF16, F16 or F32 " +
                    shape_text({out, in / g}) + " (groups of " + std::to_string(g) + ")");
  }
  return std::vector<int64_t>{out, in};
}

torch::Tensor read_pack_quantized(const HfWeights& w, const std::string& name) {
  const torch::Tensor packed = read_hf_tensor(w.tensors().at(name + "_packed"));
  const torch::Tensor scale = read_hf_tensor(w.tensors().at(name + "_scale"));
  const int64_t out = packed.size(0), in = packed.size(1) * 8;
  // Little-endian words: byte b of a row holds elements 2b (low nibble) and 2b + 1 (high).
  const auto bytes = packed.view(torch::kUInt8).to(torch::kShort);
  const auto codes = torch::stack({bytes.bitwise_and(15), bytes.bitwise_right_shift(4)}, -1)
                         .reshape({out, in})
                         .sub(8);
  // compressed-tensors' _dequantize: the codes in the scale's dtype, times the group's scale.
  const int64_t groups = scale.size(1);
  return (codes.to(scale.scalar_type()).view({out, groups, in / groups}) * scale.unsqueeze(-1))
      .view({out, in});
}

bool is_pack_quantized_part(const HfWeights& w, const std::string& name) {
  for (const char* part : kParts) {
    if (ends_with(name, part) &&
        w.find(name.substr(0, name.size() - std::string(part).size()) + "_packed") != nullptr) {
      return true;
    }
  }
  return false;
}

}  // namespace moe::hf
