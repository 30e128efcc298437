// The MXFP4 dequantization's dispatch (kernel or ATen reference), the raw launch's argument
// checks, and the launch shape the kernel (dequant_mxfp4.cu) and the CPU emulation both use.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "moe/kernels/dequant_mxfp4.h"
#include "moe/kernels/dequant_mxfp4_pack.h"
#include "moe/kernels/permute.h"  // cuda_kernels_compiled
#include "moe/quant/mxfp4.h"

namespace moe::kernels {

// Names of their own: a unity build batches this file with dequant_4bit_ops.cpp.
namespace {

namespace mx = dequant_mxfp4_rows;
static_assert(mx::kBlockBytes == quant::kMxfp4BlockBytes);
static_assert(mx::kBlockValues == 2 * quant::kMxfp4BlockBytes);

bool mxfp4_out_dtype(at::ScalarType dt) {
  return dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16;
}

bool mxfp4_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// scales' sizes are blocks' without the last (16 bytes).
bool mxfp4_matching(const at::Tensor& blocks, const at::Tensor& scales) {
  return blocks.dim() >= 1 && blocks.size(-1) == mx::kBlockBytes &&
         blocks.sizes().slice(0, blocks.dim() - 1) == scales.sizes();
}

// `t` is a contiguous `dt` tensor of `numel` values on `device`.
void check_mxfp4_buffer(const char* name, const at::Tensor& t, at::ScalarType dt, int64_t numel,
                        const at::Device& device) {
  TORCH_CHECK(t.defined(), "moe kernels: dequantize_mxfp4: ", name, " is missing");
  TORCH_CHECK(t.scalar_type() == dt && t.numel() == numel, "moe kernels: dequantize_mxfp4: ", name,
              " must be ", dt, " of ", numel, " values, got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "moe kernels: dequantize_mxfp4: ", name, " must be contiguous");
  TORCH_CHECK(t.device() == device, "moe kernels: dequantize_mxfp4: ", name, " on ", t.device(),
              ", the output on ", device);
}

}  // namespace

namespace detail {

mx::DequantMxfp4Shape dequantize_mxfp4_shape(const at::Tensor& blocks, const at::Tensor& scales,
                                             const at::Tensor& out) {
  TORCH_CHECK(blocks.defined() && scales.defined() && mxfp4_matching(blocks, scales),
              "moe kernels: dequantize_mxfp4: blocks [..., G, 16] and scales [..., G] do not "
              "match: ",
              blocks.defined() ? blocks.sizes() : at::IntArrayRef{}, " and ",
              scales.defined() ? scales.sizes() : at::IntArrayRef{});
  const int64_t n = blocks.numel() * 2;
  TORCH_CHECK(out.defined() && mxfp4_out_dtype(out.scalar_type()),
              "moe kernels: dequantize_mxfp4: the output must be fp32, fp16 or bf16");
  const at::Device device = out.device();
  check_mxfp4_buffer("out", out, out.scalar_type(), n, device);
  check_mxfp4_buffer("blocks", blocks, at::kByte, n / 2, device);
  check_mxfp4_buffer("scales", scales, at::kByte, n / mx::kBlockValues, device);
  mx::DequantMxfp4Shape s;
  s.n = n;
  // One 16-byte store per thread where the output lies on a 16-byte boundary (n is a multiple of
  // 32, so of every pack) and the pack's bytes can be loaded as one.
  const int pack = static_cast<int>(16 / out.element_size());
  const bool packs =
      mxfp4_aligned(out.data_ptr(), 16) && mxfp4_aligned(blocks.data_ptr(), pack / 2);
  s.vec = packs ? pack : 2;
  return s;
}

void dequantize_mxfp4_cuda(const at::Tensor& blocks, const at::Tensor& scales,
                           const at::Tensor& out, bool poison) {
  TORCH_CHECK(out.defined() && out.is_cuda(),
              "moe kernels: dequantize_mxfp4: the output must be a CUDA tensor");
  const auto s = dequantize_mxfp4_shape(blocks, scales, out);  // every buffer on out's device
  if (poison) out.fill_(NAN);
  dequantize_mxfp4_launch(s, dequantize_mxfp4_args(blocks, scales), out);
}

mx::DequantMxfp4Args dequantize_mxfp4_args(const at::Tensor& blocks, const at::Tensor& scales) {
  mx::DequantMxfp4Args a;
  a.blocks = blocks.data_ptr<uint8_t>();
  a.scales = scales.data_ptr<uint8_t>();
  return a;
}

}  // namespace detail

bool dequantize_mxfp4_supported(const at::Tensor& blocks, const at::Tensor& scales,
                                const at::Tensor& out) {
  if (!cuda_kernels_compiled() || !out.defined() || !out.is_cuda()) return false;
  auto on_device = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kByte && t.device() == out.device() &&
           t.is_contiguous();
  };
  return on_device(blocks) && on_device(scales) && mxfp4_matching(blocks, scales) &&
         mxfp4_out_dtype(out.scalar_type()) && out.is_contiguous() &&
         out.numel() == blocks.numel() * 2;
}

void dequantize_mxfp4_into(const at::Tensor& blocks, const at::Tensor& scales,
                           const at::Tensor& out, bool fused) {
  if (fused && dequantize_mxfp4_supported(blocks, scales, out)) {
    return detail::dequantize_mxfp4_cuda(blocks, scales, out);
  }
  TORCH_CHECK(out.defined() && out.numel() == blocks.numel() * 2,
              "moe kernels: dequantize_mxfp4: the output must have ", blocks.numel() * 2,
              " values, got ", out.defined() ? out.sizes() : at::IntArrayRef{});
  out.copy_(quant::dequantize_mxfp4(blocks, scales, out.scalar_type()).reshape(out.sizes()));
}

}  // namespace moe::kernels
