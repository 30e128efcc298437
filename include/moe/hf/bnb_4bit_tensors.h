// bitsandbytes' 4-bit serialization of a weight, as transformers saves a model loaded with
// BitsAndBytesConfig(load_in_4bit=True) (Linear4bit's state dict): NAME (U8 codes [n/2, 1]),
// NAME.absmax, NAME.quant_map, NAME.quant_state.bitsandbytes__nf4|fp4 (the JSON of quant_type,
// blocksize, dtype, shape and, under double quant, nested_blocksize, nested_dtype,
// nested_offset, as U8 bytes), and under double quant NAME.nested_absmax, NAME.nested_quant_map.
#pragma once

#include <optional>
#include <string>

#include "moe/hf/hf_files.h"
#include "moe/quant/bnb_4bit.h"

namespace moe::hf {

// The 4-bit state of `name` when the directory holds it in that form (its quant_state
// companion exists); nullopt for a plain float tensor. A state we cannot read as bitsandbytes
// wrote it (a missing companion, a code book that is not NF4's / FP4's, a shape that does not
// match its codes) is a UserError naming the file and the tensor.
std::optional<quant::Quantized4bit> read_bnb_4bit(const HfWeights& w, const std::string& name);

// Whether `name` is a companion tensor (absmax, quant_map, quant_state, nested_*) of a 4-bit
// weight in `w`: present in the file but not a weight of its own.
bool is_bnb_4bit_companion(const HfWeights& w, const std::string& name);

}  // namespace moe::hf
