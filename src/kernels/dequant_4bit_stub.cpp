// A build without nvcc: the 4-bit dequantization kernel's launch exists so that callers and tests
// link; dequantize_4bit_into never calls it there (cuda_kernels_compiled() is false).
#ifndef MOE_HAVE_CUDA
#include <c10/util/Exception.h>

#include "moe/kernels/dequant_4bit_pack.h"

namespace moe::kernels::detail {
void dequantize_4bit_launch(const dequant_4bit_rows::Dequant4bitShape&,
                            const dequant_4bit_rows::Dequant4bitArgs&,
                            const dequant_4bit_rows::Dequant4bitTables&, const at::Tensor&) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace moe::kernels::detail
#endif
