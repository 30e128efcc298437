// A build without nvcc: the MXFP4 dequantization kernel's launch exists so that callers and tests
// link; dequantize_mxfp4_into never calls it there (cuda_kernels_compiled() is false).
#ifndef MOE_HAVE_CUDA
#include <c10/util/Exception.h>

#include "moe/kernels/dequant_mxfp4_pack.h"

namespace moe::kernels::detail {
void dequantize_mxfp4_launch(const dequant_mxfp4_rows::DequantMxfp4Shape&,
                             const dequant_mxfp4_rows::DequantMxfp4Args&, const at::Tensor&) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace moe::kernels::detail
#endif
