#include "moe/util/safetensors_dtype.h"

#include <array>
#include <stdexcept>
#include <utility>

namespace moe {

namespace {
constexpr std::array<std::pair<const char*, at::ScalarType>, 12> kTable = {{
    {"F64", at::kDouble},
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
    {"F8_E4M3", at::kFloat8_e4m3fn},  // FP8 checkpoints (hf/fp8_tensors.h)
    {"F8_E5M2", at::kFloat8_e5m2},
}};
}  // namespace

std::optional<at::ScalarType> scalar_type_of_safetensors(const std::string& dtype) {
  for (const auto& [name, type] : kTable) {
    if (dtype == name) return type;
  }
  return std::nullopt;
}

const char* safetensors_dtype_of(at::ScalarType t) {
  for (const auto& [name, type] : kTable) {
    if (t == type) return name;
  }
  throw std::invalid_argument(std::string("no safetensors dtype for ") + c10::toString(t));
}

bool is_float_weight_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

}  // namespace moe
