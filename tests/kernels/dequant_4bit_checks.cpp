// The 4-bit dequantization's grid and bitwise comparison (dequant_4bit_checks.h).
#include "dequant_4bit_checks.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>

namespace moe::kernel_checks {

std::vector<Dequant4bitCase> dequant_4bit_cases() {
  std::vector<Dequant4bitCase> v;
  const std::vector<std::vector<int64_t>> shapes = {{1},      {3},         {7, 9},        {5, 100},
                                                    {33, 65}, {768, 2048}, {4 * 352, 704}};
  for (auto type : {quant::Quant4bitType::kNf4, quant::Quant4bitType::kFp4}) {
    for (bool dq : {false, true}) {
      for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        for (const auto& s : shapes) v.push_back({type, dq, dt, s});
        v.push_back({type, dq, dt, {64, 64}, /*misaligned=*/true});
      }
    }
  }
  return v;
}

std::string case_name(const Dequant4bitCase& c) {
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  std::string shape;
  for (const int64_t s : c.shape) shape += (shape.empty() ? "" : "x") + std::to_string(s);
  return std::string(c.type == quant::Quant4bitType::kNf4 ? "nf4" : "fp4") +
         (c.double_quant ? "_dq_" : "_") + dt + "_" + shape + (c.misaligned ? "_misaligned" : "");
}

torch::Tensor make_dequant_weights(const Dequant4bitCase& c) {
  int64_t n = 1;
  for (const int64_t s : c.shape) n *= s;
  torch::manual_seed(static_cast<uint64_t>(n * 31 + c.shape.size()));
  auto w = torch::randn({n}) * 0.02;
  // Edges, whole blocks where n allows: zeros, ~1e5 (fp16 overflows), ~1e-30 (0 in fp16 and
  // tiny in bf16), ~1e-6 (fp16 subnormals), a lone value (every other code 0). Small n keep the
  // normal values.
  const int64_t bs = quant::kBlocksize;
  if (n >= 5 * bs) {
    w.narrow(0, 0, bs).zero_();
    w.narrow(0, bs, bs).mul_(5e6);
    w.narrow(0, 2 * bs, bs).mul_(5e-29);
    w.narrow(0, 3 * bs, bs).zero_();
    w[3 * bs + 5] = -0.75;
    w.narrow(0, 4 * bs, bs).mul_(1e-4);
  }
  return w.view(c.shape);
}

quant::Quantized4bit make_quantized(const Dequant4bitCase& c) {
  // Kept per (type, double quant, shape): the output dtypes of a grid share one state.
  static std::map<std::string, quant::Quantized4bit> made;
  Dequant4bitCase key = c;
  key.dtype = torch::kFloat;
  key.misaligned = false;
  auto [it, fresh] = made.try_emplace(case_name(key));
  if (fresh) it->second = quant::quantize_4bit(make_dequant_weights(c), c.type, c.double_quant);
  return it->second;
}

torch::Tensor make_dequant_output(const Dequant4bitCase& c, int64_t n,
                                  const torch::Device& device) {
  const auto opts = torch::TensorOptions(device).dtype(c.dtype);
  if (!c.misaligned) return torch::full({n}, NAN, opts);
  return torch::full({n + 1}, NAN, opts).narrow(0, 1, n);
}

Verdict check_dequant_4bit(const quant::Quantized4bit& q, const torch::Tensor& got) {
  const auto dt = got.scalar_type();
  const auto want = quant::dequantize_4bit(q, dt).reshape(-1);
  if (got.sizes() != want.sizes()) return shape_mismatch("out", got, want);
  // Bits: -0 and +0 differ, NaN (never written) differs from any value.
  const auto bits = dt == torch::kFloat ? torch::kInt : torch::kShort;
  const auto g = got.to(want.device()).contiguous();
  const auto bad = (g.view(bits) != want.view(bits)).reshape(-1);
  Verdict v{"out", want.numel(), bad.sum().item<int64_t>(), ""};
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os << "first at " << i << " (block " << i / q.blocksize << "): got " << g[i].item<double>()
       << " (bits " << g.view(bits)[i].item<int64_t>() << "), expected " << want[i].item<double>()
       << " (bits " << want.view(bits)[i].item<int64_t>() << ")";
    v.detail = os.str();
  }
  return v;
}

}  // namespace moe::kernel_checks
