// The 4-bit dequantization's dispatch (kernel or ATen reference), the raw launch's argument
// checks, and the launch shape the kernel (dequant_4bit.cu) and the CPU emulation both use.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>

#include "moe/kernels/dequant_4bit.h"
#include "moe/kernels/dequant_4bit_pack.h"
#include "moe/kernels/permute.h"  // cuda_kernels_compiled

namespace moe::kernels {

namespace {

namespace dq = dequant_4bit_rows;
static_assert(dq::kNestedBlock == quant::kNestedBlocksize);

bool out_dtype(at::ScalarType dt) {
  return dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16;
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// `t` is a contiguous `dt` tensor of `numel` values on `device`.
void check_buffer(const char* name, const at::Tensor& t, at::ScalarType dt, int64_t numel,
                  const at::Device& device) {
  TORCH_CHECK(t.defined(), "moe kernels: dequantize_4bit: ", name, " is missing");
  TORCH_CHECK(t.scalar_type() == dt && t.numel() == numel, "moe kernels: dequantize_4bit: ", name,
              " must be ", dt, " of ", numel, " values, got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "moe kernels: dequantize_4bit: ", name, " must be contiguous");
  TORCH_CHECK(t.device() == device, "moe kernels: dequantize_4bit: ", name, " on ", t.device(),
              ", the output on ", device);
}

}  // namespace

namespace detail {

dq::Dequant4bitShape dequantize_4bit_shape(const quant::Quantized4bit& q, const at::Tensor& out) {
  TORCH_CHECK(q.blocksize > 0 && q.blocksize % 2 == 0,
              "moe kernels: dequantize_4bit: blocksize must be even and > 0, got ", q.blocksize);
  const int64_t n = q.numel(), blocks = q.blocks();
  TORCH_CHECK(out.defined() && out_dtype(out.scalar_type()),
              "moe kernels: dequantize_4bit: the output must be fp32, fp16 or bf16");
  const at::Device device = out.device();
  check_buffer("out", out, out.scalar_type(), n, device);
  check_buffer("codes", q.codes, at::kByte, (n + 1) / 2, device);
  if (q.double_quant()) {
    check_buffer("absmax", q.absmax, at::kByte, blocks, device);
    check_buffer("nested_absmax", q.nested_absmax, at::kFloat,
                 (blocks + dq::kNestedBlock - 1) / dq::kNestedBlock, device);
    check_buffer("offset", q.offset, at::kFloat, 1, device);
  } else {
    check_buffer("absmax", q.absmax, at::kFloat, blocks, device);
  }
  dq::Dequant4bitShape s;
  s.n = n;
  s.blocksize = q.blocksize;
  s.double_quant = q.double_quant();
  // One 16-byte store per thread where every pack lies in one block and on a 16-byte boundary.
  const int pack = static_cast<int>(16 / out.element_size());
  const bool packs = n % pack == 0 && q.blocksize % pack == 0 && aligned(out.data_ptr(), 16) &&
                     aligned(q.codes.data_ptr(), pack / 2);
  s.vec = packs ? pack : 2;
  return s;
}

void dequantize_4bit_cuda(const quant::Quantized4bit& q, const at::Tensor& out, bool poison) {
  TORCH_CHECK(out.defined() && out.is_cuda(),
              "moe kernels: dequantize_4bit: the output must be a CUDA tensor");
  const auto s = dequantize_4bit_shape(q, out);  // every buffer on out's device
  if (poison) out.fill_(NAN);
  dequantize_4bit_launch(s, dequantize_4bit_args(q), dequantize_4bit_tables(q.type), out);
}

dq::Dequant4bitArgs dequantize_4bit_args(const quant::Quantized4bit& q) {
  dq::Dequant4bitArgs a;
  a.codes = q.codes.data_ptr<uint8_t>();
  if (q.double_quant()) {
    a.absmax_q = q.absmax.data_ptr<uint8_t>();
    a.nested_absmax = q.nested_absmax.data_ptr<float>();
    a.offset = q.offset.data_ptr<float>();
  } else {
    a.absmax = q.absmax.data_ptr<float>();
  }
  return a;
}

dq::Dequant4bitTables dequantize_4bit_tables(quant::Quant4bitType type) {
  auto make = [](quant::Quant4bitType t) {
    dq::Dequant4bitTables tables{};
    const auto code = quant::code_4bit(t).contiguous(), dyn = quant::dynamic_map().contiguous();
    TORCH_CHECK(code.numel() == dq::kCodes && dyn.numel() == dq::kDynamic);
    std::memcpy(tables.code, code.data_ptr<float>(), sizeof(tables.code));
    std::memcpy(tables.dyn, dyn.data_ptr<float>(), sizeof(tables.dyn));
    return tables;
  };
  static const dq::Dequant4bitTables nf4 = make(quant::Quant4bitType::kNf4),
                                     fp4 = make(quant::Quant4bitType::kFp4);
  return type == quant::Quant4bitType::kNf4 ? nf4 : fp4;
}

}  // namespace detail

bool dequantize_4bit_supported(const quant::Quantized4bit& q, const at::Tensor& out) {
  if (!cuda_kernels_compiled() || !out.defined() || !out.is_cuda()) return false;
  const bool stats =
      q.absmax.defined() && q.absmax.device() == out.device() &&
      (!q.double_quant() || (q.nested_absmax.device() == out.device() && q.offset.defined() &&
                             q.offset.device() == out.device()));
  return stats && q.codes.defined() && q.codes.device() == out.device() &&
         out_dtype(out.scalar_type()) && out.is_contiguous() && out.numel() == q.numel();
}

void dequantize_4bit_into(const quant::Quantized4bit& q, const at::Tensor& out, bool fused) {
  if (fused && dequantize_4bit_supported(q, out)) return detail::dequantize_4bit_cuda(q, out);
  out.view(q.shape).copy_(quant::dequantize_4bit(q, out.scalar_type()));
}

}  // namespace moe::kernels
