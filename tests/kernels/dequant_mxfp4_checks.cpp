// The MXFP4 dequantization's grid and bitwise comparison (dequant_mxfp4_checks.h).
#include "dequant_mxfp4_checks.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>

#include "moe/quant/mxfp4.h"

namespace moe::kernel_checks {

std::vector<DequantMxfp4Case> dequant_mxfp4_cases() {
  std::vector<DequantMxfp4Case> v;
  using D = Mxfp4Data;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    v.push_back({D::kAllCodes, dt, {256}});
    v.push_back({D::kAllCodes, dt, {256}, /*misaligned=*/true});
    v.push_back({D::kRandom, dt, {1}});
    v.push_back({D::kRandom, dt, {3, 5}});
    v.push_back({D::kRandom, dt, {7, 33}});
    v.push_back({D::kRandom, dt, {7, 33}, /*misaligned=*/true});
    v.push_back({D::kRandom, dt, {2, 3, 90}});
    v.push_back({D::kWeights, dt, {4, 64, 90}});
    v.push_back({D::kWeights, dt, {45, 90}});
  }
  return v;
}

std::string case_name(const DequantMxfp4Case& c) {
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  const char* data = c.data == Mxfp4Data::kAllCodes ? "codes"
                     : c.data == Mxfp4Data::kRandom ? "random"
                                                    : "weights";
  std::string shape;
  for (const int64_t s : c.shape) shape += (shape.empty() ? "" : "x") + std::to_string(s);
  return std::string(data) + "_" + dt + "_" + shape + (c.misaligned ? "_misaligned" : "");
}

namespace {

Mxfp4Tensors make_data(const DequantMxfp4Case& c) {
  int64_t groups = 1;
  for (const int64_t s : c.shape) groups *= s;
  auto block_shape = c.shape;
  block_shape.push_back(16);
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
  switch (c.data) {
    case Mxfp4Data::kAllCodes: {
      // Byte j of block b: low nibble j, high nibble (7 j + b) % 16 (7 is odd: every code once
      // a block in either nibble, the pairs moving from block to block); scale byte b % 256.
      const auto b = torch::arange(groups, torch::kLong).unsqueeze(1);
      const auto j = torch::arange(16, torch::kLong).unsqueeze(0);
      const auto bytes = j + ((7 * j + b).remainder(16) * 16);
      return {bytes.to(torch::kUInt8).reshape(block_shape).contiguous(),
              b.remainder(256).to(torch::kUInt8).reshape(c.shape).contiguous()};
    }
    case Mxfp4Data::kRandom: {
      torch::manual_seed(static_cast<uint64_t>(groups * 131 + c.shape.size()));
      return {torch::randint(0, 256, block_shape, u8), torch::randint(0, 256, c.shape, u8)};
    }
    case Mxfp4Data::kWeights:
      break;
  }
  torch::manual_seed(static_cast<uint64_t>(groups * 31 + c.shape.size()));
  auto w = torch::randn({groups, 32}) * 0.02;
  // Edge blocks where there is room: zeros (scale byte 0), ~1e5 (fp16 overflows), ~1e-30 (0 in
  // fp16, tiny in bf16), ~2e-6 (fp16 subnormals), a lone value (every other code 0).
  if (groups >= 8) {
    w[0].zero_();
    w[1].mul_(5e6);
    w[2].mul_(5e-29);
    w[3].zero_();
    w[3][5] = -0.75;
    w[4].mul_(1e-4);
    w[5].mul_(3e-3);
  }
  auto [blocks, scales] = quant::quantize_mxfp4(w);  // [groups, 1, 16]
  return {blocks.reshape(block_shape).contiguous(), scales.reshape(c.shape).contiguous()};
}

}  // namespace

Mxfp4Tensors make_mxfp4(const DequantMxfp4Case& c) {
  // Kept per (data, shape): the output dtypes of a grid share one stack.
  static std::map<std::string, Mxfp4Tensors> made;
  DequantMxfp4Case key = c;
  key.dtype = torch::kFloat;
  key.misaligned = false;
  auto [it, fresh] = made.try_emplace(case_name(key));
  if (fresh) it->second = make_data(c);
  return it->second;
}

torch::Tensor make_mxfp4_output(const DequantMxfp4Case& c, int64_t n, const torch::Device& device) {
  const auto opts = torch::TensorOptions(device).dtype(c.dtype);
  if (!c.misaligned) return torch::full({n}, NAN, opts);
  return torch::full({n + 1}, NAN, opts).narrow(0, 1, n);
}

Verdict check_dequant_mxfp4(const Mxfp4Tensors& m, const torch::Tensor& got) {
  const auto dt = got.scalar_type();
  const auto want = quant::dequantize_mxfp4(m.blocks, m.scales, dt).reshape(-1);
  if (got.sizes() != want.sizes()) return shape_mismatch("out", got, want);
  // Bits: -0 and +0 differ, NaN (never written) differs from any value the reference makes.
  const auto bits = dt == torch::kFloat ? torch::kInt : torch::kShort;
  const auto g = got.to(want.device()).contiguous();
  const auto bad = ((g.view(bits) != want.view(bits)) | g.isnan() | want.isnan()).reshape(-1);
  Verdict v{"out", want.numel(), bad.sum().item<int64_t>(), ""};
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    const auto flat_blocks = m.blocks.reshape(-1);
    const auto flat_scales = m.scales.reshape(-1);
    const int64_t byte = flat_blocks[i / 2].item<int64_t>();
    std::ostringstream os;
    os << "first at " << i << " (block " << i / 32 << ", scale byte "
       << flat_scales[i / 32].item<int64_t>() << ", code " << (i % 2 ? byte >> 4 : byte & 15)
       << "): got " << g[i].item<double>() << " (bits " << g.view(bits)[i].item<int64_t>()
       << "), expected " << want[i].item<double>() << " (bits "
       << want.view(bits)[i].item<int64_t>() << ")";
    v.detail = os.str();
  }
  return v;
}

}  // namespace moe::kernel_checks
