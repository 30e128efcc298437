// The SwiGLU family's oracles and tolerances (swiglu_checks.h).
#include "swiglu_checks.h"

#include <torch/torch.h>

#include "moe/kernels/swiglu.h"

namespace moe::kernel_checks {

using kernels::swiglu_rows::Gate;

std::vector<SwigluCase> swiglu_cases() {
  std::vector<SwigluCase> v;
  for (Gate gate : {Gate::kSilu, Gate::kGeluTanh}) {
    for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (auto [r, c] :
           {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {7, 64}, {33, 1024}, {2, 4104}}) {
        for (bool packed : {false, true}) {
          v.push_back({dt, r, c, false, packed, gate});
          if (r * c > 1000) v.push_back({dt, r, c, true, packed, gate});
        }
      }
    }
    if (gate == Gate::kSilu) v.push_back({torch::kBFloat16, 4096, 1024, false});
    v.push_back({torch::kBFloat16, 4096, 1024, false, true, gate});
  }
  return v;
}

std::string case_name(const SwigluCase& c) {
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  return std::string(c.gate == Gate::kGeluTanh ? "geglu_" : "") + dt + "_" +
         std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         (c.misaligned ? "_misaligned" : "") + (c.packed ? "_packed" : "");
}

namespace {

// A [rows, cols] tensor of `values`' contents whose data starts one element past an allocation
// (misaligned for 16-byte packs) when asked.
torch::Tensor placed(const torch::Tensor& values, bool misaligned) {
  if (!misaligned) return values.contiguous();
  auto buffer = torch::empty({values.numel() + 1}, values.options());
  auto view = buffer.narrow(0, 1, values.numel()).view(values.sizes());
  view.copy_(values);
  return view;
}

}  // namespace

SwigluInputs make_swiglu_inputs(const SwigluCase& c, const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(c.rows * 7919 + c.cols));
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  auto gate = torch::randn({c.rows * c.cols}, f32) * 3;
  // Edges: zero, silu's minimum (d silu = 0 there), where expf(-x) overflows (x < -88.72) or
  // nears it, large values of both signs, tiny ones.
  const std::vector<float> edges{0.f,   -1.2784645f, 1.f,   -1.f,   20.f,  -20.f,  87.f,
                                 -87.f, -88.5f,      -89.f, -100.f, 100.f, 1e-30f, -3e-8f};
  const int64_t n = std::min<int64_t>(gate.numel(), static_cast<int64_t>(edges.size()));
  gate.narrow(0, 0, n).copy_(torch::tensor(edges, f32).narrow(0, 0, n));
  if (c.gate == Gate::kGeluTanh && gate.numel() > n) {
    // gelu's: its minimum (d gelu = 0), where 1 + tanh cancels (-3 .. -10) and rounds to 0
    // (-10 and below), where x^3 overflows fp32 (|x| > 7e12; past fp16's range, so not there).
    std::vector<float> gelu_edges{-0.7517916f, -3.f, -5.5f, -9.f, -10.f, -12.f, 3.f};
    if (c.dtype != torch::kHalf) gelu_edges.insert(gelu_edges.end(), {1e13f, -1e13f});
    const int64_t m = std::min<int64_t>(gate.numel() - n, static_cast<int64_t>(gelu_edges.size()));
    gate.narrow(0, n, m).copy_(torch::tensor(gelu_edges, f32).narrow(0, 0, m));
  }
  SwigluInputs in;
  in.gate_fn = c.gate;
  const auto opts = torch::TensorOptions(device).dtype(c.dtype);
  const auto up = torch::randn({c.rows, c.cols}, f32);
  if (c.packed) {
    in.gate_up = placed(torch::cat({gate.view({c.rows, c.cols}), up}, 1).to(opts), c.misaligned);
    in.gate = in.gate_up.narrow(1, 0, c.cols);
    in.up = in.gate_up.narrow(1, c.cols, c.cols);
  } else {
    in.gate = placed(gate.view({c.rows, c.cols}).to(opts), c.misaligned);
    in.up = placed(up.to(opts), c.misaligned);
  }
  in.grad = placed(torch::randn({c.rows, c.cols}, f32).to(opts), c.misaligned);
  return in;
}

// Tolerances, per element, from the kernel's arithmetic (moe/kernels/swiglu_pack.h), with
// u = 2^-24 (fp32 unit roundoff) and h(x) = half an ulp of T at |x| (a rounding to T):
//  - expf(-g): <= 2 ulp (CUDA; the C library's is under 1) = 4u relative; d = 1 + e rounded:
//    5u; s = g / d and sig = 1 / d rounded: 6u. Where expf overflows (g < -88.7) the kernel's
//    s and sig are 0: their exact values (< 4e-37) are the error. Any fp32 rounding may land
//    among the subnormals: 2^-149 (absolute) each.
//  - forward: s_T = T(s): e_s = 6u|s| + h(s); h = T(s_T * up): e_s|up| + u|h| + h(h).
//  - grad_up = T(dh * s_T): |dh| e_s + u|dh s| + h(dh s).
//  - grad_gate = T(T(dh * up) * sig * fma(g, 1 - sig, 1)): the product's rounding to T and
//    fp32 (A = |dh up|: u A + h(A)), sig's error (6u sig), 1 - sig rounded (u |1 - sig|), scaled
//    by |g| in the fma (which cancels near silu's minimum: the error there is absolute), the fma
//    and the two products rounded (u each), then T: h(result).
namespace {

std::vector<Verdict> check_silu_product(const SwigluInputs& in, const SwigluOutputs& got) {
  const auto dt = in.gate.scalar_type();
  const double u = kU32, tiny = 0x1p-149;
  const auto g = in.gate.to(torch::kDouble), up = in.up.to(torch::kDouble),
             dh = in.grad.to(torch::kDouble);
  auto half_ulp = [&](const torch::Tensor& x) { return 0.5 * ulp(x.abs() * (1 + 16 * u), dt); };
  const auto sig = torch::sigmoid(g), s = g * sig, h = s * up;
  const auto overflow = (g < -88.0).to(torch::kDouble);  // expf(-g) is inf or nearly so
  const auto e_sig = 6 * u * sig + tiny + overflow * sig;
  const auto e_s = 6 * u * s.abs() + g.abs() * tiny + overflow * s.abs() + half_ulp(s);
  const auto tol_h =
      e_s * up.abs() * (1 + u) + u * h.abs() + tiny + half_ulp(h.abs() + e_s * up.abs());

  const auto gu = dh * s;
  const auto tol_gu =
      dh.abs() * e_s * (1 + u) + u * gu.abs() + tiny + half_ulp(gu.abs() + dh.abs() * e_s);

  const auto F = 1 + g * (1 - sig), A = (dh * up).abs();
  const auto gg = dh * up * sig * F;
  const auto e_ds = u * A + half_ulp(A * (1 + u));
  const auto e_1ms = e_sig + u * (1 - sig);
  const auto e_F = g.abs() * e_1ms * (1 + u) + u * F.abs();
  const auto M1 = (A + e_ds) * (sig + e_sig);  // |T(dh up) * sig| bounded
  const auto e_P1 = e_ds * (sig + e_sig) + A * e_sig + u * M1 + tiny;
  const auto e_P = e_P1 * (F.abs() + e_F) + M1 * e_F + u * M1 * (F.abs() + e_F) + tiny;
  const auto tol_gg = e_P + half_ulp(gg.abs() + e_P);

  return {within("h", got.h, h, tol_h), within("grad_gate", got.grad_gate, gg, tol_gg),
          within("grad_up", got.grad_up, gu, tol_gu)};
}

// GeGLU (moe/kernels/swiglu_pack.h's gelu_tanh_f, gelu_tanh_grad_f), with b and k ATen's fp32
// constants (the oracle's too) and u, h() as above:
//  - inner = b fma(k, x^3, x): x^3 two roundings, the fma and the product: 3u b (|x| + k |x|^3).
//  - t = tanh(inner): CUDA's tanhf is within 2 ulp (4u |t|), plus inner's error times
//    1 - t^2; r = 1 + t rounded (u |r|; where t nears -1 this cancels: the error is absolute).
//  - s = T(0.5 x * r): 0.5 |x| e_r, one product's rounding, then T's; h and grad_up as SwiGLU's.
//  - grad_gate = T(T(dh * up) * (0.5 r + 0.5 x (1 - t^2) b (1 + 3k x^2))): 1 - t^2 by an fma
//    (2 |t| e_t + u), the inner derivative's four roundings (3k in fp32 included), the two
//    products and the sum rounded (u each), the final product and T.
std::vector<Verdict> check_gelu_product(const SwigluInputs& in, const SwigluOutputs& got) {
  const auto dt = in.gate.scalar_type();
  const double u = kU32, tiny = 0x1p-149, second = 1 + 16 * u;
  const double b = kernels::swiglu_rows::kGeluBeta, k = kernels::swiglu_rows::kGeluKappa;
  const auto x = in.gate.to(torch::kDouble), up = in.up.to(torch::kDouble),
             dh = in.grad.to(torch::kDouble);
  auto half_ulp = [&](const torch::Tensor& v) { return 0.5 * ulp(v.abs() * (1 + 16 * u), dt); };
  const auto ax = x.abs(), inner = b * (x + k * x.pow(3)), t = torch::tanh(inner);
  const auto r = 1 + t, s = 0.5 * x * r, h = s * up;
  const auto e_in = 3 * u * b * (ax + k * ax.pow(3)) + tiny;
  const auto e_t = (1 - t * t) * e_in + 4 * u * t.abs() + tiny;
  const auto e_r = e_t + u * r.abs();
  const auto e_s = (0.5 * ax * e_r + u * s.abs() + tiny) * second + half_ulp(s);
  const auto tol_h =
      e_s * up.abs() * second + u * h.abs() + tiny + half_ulp(h.abs() + e_s * up.abs());

  const auto gu = dh * s;
  const auto tol_gu =
      dh.abs() * e_s * second + u * gu.abs() + tiny + half_ulp(gu.abs() + dh.abs() * e_s);

  const auto td = 1 - t * t, id = b * (1 + 3 * k * x * x), left = 0.5 * ax;
  const auto D = 0.5 * r + 0.5 * x * td * id;
  const auto e_td = 2 * t.abs() * e_t + e_t * e_t + u * td.abs() + tiny;
  const auto e_id = 4 * u * id;
  const auto e_P = left * e_td + u * left * td + tiny;
  const auto e_rd = e_P * id + left * td * e_id + u * left * td * id + tiny;
  const auto e_D = (0.5 * e_r + e_rd + u * D.abs()) * second;
  const auto A = (dh * up).abs();
  const auto e_ds = u * A + half_ulp(A * (1 + u));
  const auto gg = dh * up * D;
  const auto e_res =
      (e_ds * (D.abs() + e_D) + A * e_D + u * (A + e_ds) * (D.abs() + e_D)) * second + tiny;
  const auto tol_gg = e_res + half_ulp(gg.abs() + e_res);

  return {within("h", got.h, h, tol_h), within("grad_gate", got.grad_gate, gg, tol_gg),
          within("grad_up", got.grad_up, gu, tol_gu)};
}

}  // namespace

std::vector<Verdict> check_swiglu(const SwigluInputs& in, const SwigluOutputs& got) {
  return in.gate_fn == Gate::kGeluTanh ? check_gelu_product(in, got) : check_silu_product(in, got);
}

SwigluOutputs swiglu_aten(const SwigluInputs& in) {
  torch::AutoGradMode on(true);
  const auto g = in.gate.detach().requires_grad_(true), u = in.up.detach().requires_grad_(true);
  const auto h = in.gate_fn == Gate::kGeluTanh ? kernels::geglu_reference(g, u)
                                               : kernels::swiglu_reference(g, u);
  h.backward(in.grad);
  return {h.detach(), g.grad(), u.grad()};
}

std::vector<Mismatch> swiglu_aten_mismatches(const SwigluOutputs& aten, const SwigluOutputs& got) {
  return {mismatch("h_aten", got.h, aten.h),
          mismatch("grad_gate_aten", got.grad_gate, aten.grad_gate),
          mismatch("grad_up_aten", got.grad_up, aten.grad_up)};
}

}  // namespace moe::kernel_checks
