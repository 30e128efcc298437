// gpt-oss's clamped SwiGLU: oracles and tolerances (clamped_swiglu_checks.h).
#include "clamped_swiglu_checks.h"

#include <torch/torch.h>

#include <cstdio>

#include "moe/kernels/clamped_swiglu.h"

namespace moe::kernel_checks {

std::vector<ClampedSwigluCase> clamped_swiglu_cases() {
  std::vector<ClampedSwigluCase> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto [r, c] :
         {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {7, 64}, {33, 1024}, {2, 4104}}) {
      v.push_back({dt, r, c, false});
      if (r * c > 1000) v.push_back({dt, r, c, true});
    }
    v.push_back({dt, 33, 1024, false, 3.3, 0.9});
  }
  v.push_back({torch::kBFloat16, 1024, 2880, false});
  return v;
}

std::string case_name(const ClampedSwigluCase& c) {
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  std::string name = std::string(dt) + "_" + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                     (c.misaligned ? "_misaligned" : "");
  if (c.limit != 7.0 || c.alpha != 1.702) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "_limit%g_alpha%g", c.limit, c.alpha);
    for (char* p = buf; *p; ++p) {
      if (*p == '.') *p = 'p';  // test names: letters, digits and underscores
    }
    name += buf;
  }
  return name;
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

double bound_of(double limit, torch::ScalarType dtype) {
  return torch::tensor(static_cast<float>(limit)).to(dtype).item<double>();
}

}  // namespace

double clamped_swiglu_bound(const ClampedSwigluInputs& in) {
  return bound_of(in.limit, in.gate.scalar_type());
}

double clamped_swiglu_alpha(const ClampedSwigluInputs& in) {
  return static_cast<double>(static_cast<float>(in.alpha));
}

ClampedSwigluInputs make_clamped_swiglu_inputs(const ClampedSwigluCase& c,
                                               const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(c.rows * 7919 + c.cols));
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  const double L = bound_of(c.limit, c.dtype);
  // One ulp of the dtype at the bound: L + du lies just outside, L - du just inside (both are
  // values of the dtype).
  const double du = ulp(torch::tensor(L, f64), c.dtype).item<double>();
  auto gate = torch::randn({c.rows * c.cols}, f64) * 4;
  auto up = torch::randn({c.rows * c.cols}, f64) * 4;
  // Edges, paired element for element: the bounds themselves (the gradient passes), one ulp
  // outside (it stops) and inside, far beyond, where expf(-alpha g) overflows (alpha g < -88.7)
  // or nears it, the product's stationary point (d/dg g sigmoid(alpha g) = 0 near alpha g =
  // -1.28), u + 1 = 0, zeros and tiny values.
  const std::vector<double> gate_edges{L,     -L,    L + du, L - du, -L - du, -L + du, 0.0,
                                       -0.75, 100.0, -100.0, -52.0,  -60.0,   1e-30,   -3e-8,
                                       1.0,   -1.0,  2 * L,  -2 * L, L,       -L};
  const std::vector<double> up_edges{-L,  L,     -L - du, L + du, -L + du, L - du, -1.0,
                                     0.0, 100.0, -100.0,  1e-30,  -3e-8,   L,      -L,
                                     3.0, -3.0,  L + du,  L,      L,       -L - du};
  const int64_t n = std::min<int64_t>(gate.numel(), static_cast<int64_t>(gate_edges.size()));
  gate.narrow(0, 0, n).copy_(torch::tensor(gate_edges, f64).narrow(0, 0, n));
  up.narrow(0, 0, n).copy_(torch::tensor(up_edges, f64).narrow(0, 0, n));
  ClampedSwigluInputs in;
  in.limit = c.limit, in.alpha = c.alpha;
  const auto opts = torch::TensorOptions(device).dtype(c.dtype);
  in.gate = placed(gate.view({c.rows, c.cols}).to(opts), c.misaligned);
  in.up = placed(up.view({c.rows, c.cols}).to(opts), c.misaligned);
  in.grad = placed(torch::randn({c.rows, c.cols}, f64).to(opts), c.misaligned);
  return in;
}

std::pair<torch::Tensor, torch::Tensor> clamped_swiglu_inside(const ClampedSwigluInputs& in) {
  const double L = clamped_swiglu_bound(in);
  const auto x = in.gate.to(torch::kDouble), y = in.up.to(torch::kDouble);
  return {x <= L, (y >= -L).logical_and(y <= L)};
}

namespace {

// The oracle's values and each output's tolerance, from the kernel's arithmetic
// (moe/kernels/clamped_swiglu_pack.h). u = 2^-24 (fp32 unit roundoff); hu(x) = half an ulp of T at
// |x| (x an upper bound of the value rounded to T); tiny = 2^-149, one fp32 rounding among the
// subnormals. Exact values: g, u_c (the clamps are exact), a = alpha g, s = sigmoid(a), glu = g s,
// p = u_c + 1, h = p glu. Each computed value's error e_* against its exact value:
//  - a_k = T(fl(alpha g)): e_a = u|a| + hu(a).
//  - s_k = T(1 / (1 + expf(-a_k))): sigmoid moves by at most s(1 - s) e_a exp(e_a) over
//    [a - e_a, a + e_a] (d/da log sigmoid' = 1 - 2s lies in (-1, 1)); expf <= 2 ulp, the sum
//    and the division rounded: 6u; 0 where expf overflows (a < -88: the exact value, < 1e-38, is
//    the error); then hu.
//  - glu_k = T(fl(g s_k)), p_k = T(fl(u_c + 1)), h_k = T(fl(p_k glu_k)): the operands' errors
//    times the other operand's bound, u of the product, hu.
//  - backward, the same for each step of ATen's chain: d_p = T(dh glu_k) (grad_up), d_glu =
//    T(dh p_k), d_g1 = T(d_glu s_k), d_sig = T(d_glu g), c = T(1 - s_k), q = T(d_sig c), d_a =
//    T(q s_k), d_g2 = T(d_a alpha), grad_gate = T(d_g1 + d_g2) (which cancels near the
//    stationary point: its error there is absolute, the sum of both terms').
// In fp32, T is the identity and hu counts each rounding a second time (a factor 2 at most).
struct Oracle {
  torch::Tensor h, grad_gate, grad_up;    // exact (double)
  torch::Tensor tol_h, tol_gate, tol_up;  // per element
};

Oracle oracle(const ClampedSwigluInputs& in) {
  const auto dt = in.gate.scalar_type();
  const double u = kU32, tiny = 0x1p-149;
  const double L = clamped_swiglu_bound(in), al = clamped_swiglu_alpha(in);
  const auto x = in.gate.to(torch::kDouble), y = in.up.to(torch::kDouble),
             dh = in.grad.to(torch::kDouble);
  auto hu = [&](const torch::Tensor& m) { return 0.5 * ulp(m.abs() * (1 + 16 * u), dt); };
  const auto [inside_g, inside_u] = clamped_swiglu_inside(in);

  const auto g = x.clamp_max(L), uc = y.clamp(-L, L), G = g.abs();
  const auto a = al * g, s = torch::sigmoid(a), glu = g * s, p = uc + 1, h = p * glu;
  const auto e_a = u * a.abs() + hu(a.abs() * (1 + u)) + tiny;
  const auto e_prop = s * (1 - s) * e_a * torch::exp(e_a);
  const auto overflow = (a < -88.0).to(torch::kDouble);
  const auto S1 = s + e_prop;
  const auto e_s = e_prop + 6 * u * S1 + tiny + overflow * S1 + hu(S1 * (1 + 8 * u));
  const auto Sb = s + e_s;
  const auto e_glu = G * e_s + u * G * Sb + hu(G * Sb * (1 + u)) + tiny;
  const auto Gb = glu.abs() + e_glu;
  const auto e_p = u * p.abs() + hu(p.abs() * (1 + u));
  const auto Pb = p.abs() + e_p;
  const auto tol_h = p.abs() * e_glu + Gb * e_p + u * Pb * Gb + hu(Pb * Gb * (1 + u)) + tiny;

  const auto D = dh.abs();
  const auto tol_up = D * e_glu + u * D * Gb + hu(D * Gb * (1 + u)) + tiny;
  const auto dglu = dh * p;
  const auto e_dglu = D * e_p + u * D * Pb + hu(D * Pb * (1 + u)) + tiny;
  const auto DGb = dglu.abs() + e_dglu;
  const auto e_g1 = s * e_dglu + DGb * e_s + u * DGb * Sb + hu(DGb * Sb * (1 + u)) + tiny;
  const auto dsig = dglu * g;
  const auto e_dsig = G * e_dglu + u * DGb * G + hu(DGb * G * (1 + u)) + tiny;
  const auto DSb = dsig.abs() + e_dsig;
  const auto C = 1 - s;
  const auto e_c = e_s + u * (C + e_s) + hu((C + e_s) * (1 + u));
  const auto Cb = C + e_c;
  const auto e_q = C * e_dsig + DSb * e_c + u * DSb * Cb + hu(DSb * Cb * (1 + u)) + tiny;
  const auto Qb = dsig.abs() * C + e_q;
  const auto da = dsig * C * s;
  const auto e_da = s * e_q + Qb * e_s + u * Qb * Sb + hu(Qb * Sb * (1 + u)) + tiny;
  const auto DAb = da.abs() + e_da;
  const auto e_g2 = al * e_da + u * al * DAb + hu(al * DAb * (1 + u)) + tiny;
  const auto dg = dglu * s + al * da;
  const auto Mg = dg.abs() + e_g1 + e_g2;
  const auto tol_gate = e_g1 + e_g2 + u * Mg + hu(Mg * (1 + u)) + tiny;

  const auto zero = torch::zeros({}, x.options());
  return {h,
          torch::where(inside_g, dg, zero),
          torch::where(inside_u, dh * glu, zero),
          tol_h,
          tol_gate,
          tol_up};
}

}  // namespace

ClampedSwigluOutputs clamped_swiglu_oracle(const ClampedSwigluInputs& in) {
  const Oracle o = oracle(in);
  return {o.h, o.grad_gate, o.grad_up};
}

std::vector<Verdict> check_clamped_swiglu(const ClampedSwigluInputs& in,
                                          const ClampedSwigluOutputs& got) {
  const Oracle o = oracle(in);
  const auto [inside_g, inside_u] = clamped_swiglu_inside(in);
  std::vector<Verdict> vs{within("h", got.h, o.h, o.tol_h)};
  // A gradient inside its clamp against the oracle, and exactly 0 outside.
  auto split = [&](const std::string& name, const torch::Tensor& grad, const torch::Tensor& want,
                   const torch::Tensor& tol, const torch::Tensor& inside) {
    if (!grad.defined() || grad.sizes() != want.sizes()) {
      vs.push_back(shape_mismatch(name, grad, want));
      vs.push_back(shape_mismatch(name + "_outside", grad, want));
      return;
    }
    const auto outside = inside.logical_not();
    vs.push_back(within(name, grad.masked_select(inside), want.masked_select(inside),
                        tol.masked_select(inside)));
    vs.push_back(exact(name + "_outside", grad.masked_select(outside),
                       torch::zeros({outside.sum().item<int64_t>()}, want.options())));
  };
  split("grad_gate", got.grad_gate, o.grad_gate, o.tol_gate, inside_g);
  split("grad_up", got.grad_up, o.grad_up, o.tol_up, inside_u);
  return vs;
}

ClampedSwigluOutputs clamped_swiglu_aten(const ClampedSwigluInputs& in) {
  torch::AutoGradMode on(true);
  const auto g = in.gate.detach().requires_grad_(true), u = in.up.detach().requires_grad_(true);
  const auto h = kernels::clamped_swiglu_reference(g, u, in.limit, in.alpha);
  h.backward(in.grad);
  return {h.detach(), g.grad(), u.grad()};
}

std::vector<Mismatch> clamped_swiglu_aten_mismatches(const ClampedSwigluOutputs& aten,
                                                     const ClampedSwigluOutputs& got) {
  return {mismatch("h_aten", got.h, aten.h),
          mismatch("grad_gate_aten", got.grad_gate, aten.grad_gate),
          mismatch("grad_up_aten", got.grad_up, aten.grad_up)};
}

}  // namespace moe::kernel_checks
