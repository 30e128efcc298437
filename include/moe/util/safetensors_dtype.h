// safetensors' dtype names and LibTorch's scalar types in one table, read both ways. The rule for
// a dtype outside it is the same everywhere: a name maps to nothing (the caller refuses the file,
// naming it and the tensor), a scalar type has no name (a tensor we cannot write: an error).
#pragma once

#include <optional>
#include <string>

#include <torch/types.h>

namespace moe {

// "F32" -> kFloat, ...; nullopt for a name not in the table.
std::optional<at::ScalarType> scalar_type_of_safetensors(const std::string& dtype);
// kFloat -> "F32", ...; std::invalid_argument naming the type when it has no safetensors name.
const char* safetensors_dtype_of(at::ScalarType t);
// F32, BF16 and F16: the dtypes weights are read from (converted to the parameter's).
bool is_float_weight_dtype(const std::string& dtype);

}  // namespace moe
