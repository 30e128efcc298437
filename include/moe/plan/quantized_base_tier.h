// The 4-bit base tier of the memory plan (src/plan/quantized_base_tier.cpp): the frozen base a
// QLoRA run holds in 4 bits, and the dequantized copy a 4-bit GEMM reads.
#pragma once

#include <cstdint>

#include "moe/config/config.h"
#include "moe/plan/memory_plan.h"

namespace moe::plan {

// Bytes bitsandbytes' 4-bit format holds for one matrix of `values` values (quant/bnb_4bit.h,
// Quantized4bit::bytes()): ceil(values / 2) bytes of codes and one absmax per 64-value block,
// fp32; under double quant the absmax is one byte, with an fp32 scale per 256 blocks and one
// fp32 offset per matrix.
double quantized_4bit_bytes(int64_t values, bool double_quant);

// The frozen base a QLoRA run (quantization.load_in_4bit) holds in 4 bits, as the model quantizes
// it (layers/frozen_4bit.h): q, k, v and o of each attention, the dense MLPs' gate, up and down,
// and each routed expert's gate, up and down matrix, every one its own matrix; modules trained
// in full (lora.modules_to_save) stay as they are. All zero without load_in_4bit.
struct Quantized4bitBase {
  int64_t parameters = 0;  // values held in 4 bits
  int64_t matrices = 0;    // bitsandbytes matrices (each with its own blocks)
  double bytes = 0;        // codes + statistics, the exact sum over the matrices
  // Values of the largest matrix group dequantized at once before a GEMM (a fused q|k|v, an
  // output projection, a dense MLP projection, a layer's whole expert stack on the grouped-GEMM
  // path or one expert's matrix otherwise), and its bytes in the dtype it is dequantized to.
  double largest_group_values = 0, largest_group_bytes = 0;
};
Quantized4bitBase quantized_4bit_base(const config::Config& c, const PlanOptions& opt);

}  // namespace moe::plan
