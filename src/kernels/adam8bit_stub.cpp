// A build without nvcc: the 8-bit AdamW kernel's launch exists so that callers and tests link;
// FusedAdamW never calls it there (cuda_kernels_compiled() is false).
#ifndef MOE_HAVE_CUDA
#include <c10/util/Exception.h>

#include "moe/kernels/adam8bit.h"

namespace moe::kernels::detail {
void adam8bit_step(at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&,
                   at::Tensor&, const at::Tensor&, const at::Tensor&, const Adam8bitScalars&) {
  TORCH_CHECK(false, "moe-train was built without CUDA kernels");
}
}  // namespace moe::kernels::detail
#endif
