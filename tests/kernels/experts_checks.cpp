// The experts family's oracles and tolerances (experts_checks.h): one bf16 grouped GEMM and
// its gradients, and the bf16 experts module, against double-precision graphs.
#include "experts_checks.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>

namespace moe::kernel_checks {

GroupedGemmInputs make_grouped_gemm_inputs(int64_t experts, int64_t min_count,
                                           const torch::Device& device) {
  torch::manual_seed(experts * 101 + min_count);
  GroupedGemmInputs in;
  const int64_t K = 256, M = 128;
  in.counts = torch::randint(min_count, 65, {experts}, torch::kLong);
  const int64_t N = in.counts.sum().item<int64_t>();
  in.a = torch::randn({N, K}).to(torch::kBFloat16).to(device);
  in.b = (torch::randn({experts, K, M}) * 0.05).to(torch::kBFloat16).to(device);
  in.grad_c = torch::randn({N, M}).to(torch::kBFloat16).to(device);
  in.counts = in.counts.to(device);
  return in;
}

namespace {

// Per-expert segments of rows [N, ...] by counts (host copy of the counts).
std::vector<std::pair<int64_t, int64_t>> segments(const torch::Tensor& counts) {
  auto c = counts.to(torch::kCPU);
  std::vector<std::pair<int64_t, int64_t>> s;
  int64_t off = 0;
  for (int64_t e = 0; e < c.numel(); ++e) {
    const int64_t n = c[e].item<int64_t>();
    s.emplace_back(off, n);
    off += n;
  }
  return s;
}

// One bf16 GEMM output against its exact value: cuBLAS-class kernels accumulate in fp32
// (any order, split-K included: <= K roundings per term) and round once to bf16:
//   |got - exact| <= ulp_bf16(|exact|) + 1.01 K u (|A| |B|).
Verdict gemm_check(const std::string& name, const torch::Tensor& got, const torch::Tensor& exact_v,
                   const torch::Tensor& magnitude, int64_t K) {
  return within(name, got, exact_v,
                ulp(exact_v, torch::kBFloat16) + 1.01 * static_cast<double>(K) * kU32 * magnitude);
}

}  // namespace

std::vector<Verdict> check_grouped_gemm(const GroupedGemmInputs& in,
                                        const GroupedGemmOutputs& out) {
  const auto f64 = torch::kDouble;
  auto a = in.a.to(f64), b = in.b.to(f64), gc = in.grad_c.to(f64);
  const int64_t E = b.size(0), K = b.size(1), M = b.size(2);
  std::vector<torch::Tensor> c, cm, ga, gam;
  auto gb = torch::zeros_like(b), gbm = torch::zeros_like(b);
  std::vector<int64_t> empty;
  const auto segs = segments(in.counts);
  for (int64_t e = 0; e < E; ++e) {
    auto [off, n] = segs[static_cast<size_t>(e)];
    if (n == 0) {
      empty.push_back(e);
      continue;
    }
    auto as = a.narrow(0, off, n), gs = gc.narrow(0, off, n);
    c.push_back(as.mm(b[e]));
    cm.push_back(as.abs().mm(b[e].abs()));
    ga.push_back(gs.mm(b[e].t()));
    gam.push_back(gs.abs().mm(b[e].abs().t()));
    gb[e] = as.t().mm(gs);
    gbm[e] = as.abs().t().mm(gs.abs());
  }
  const int64_t N = a.size(0);
  auto cat = [&](std::vector<torch::Tensor>& v, int64_t cols) {
    return v.empty() ? torch::zeros({N, cols}, a.options()) : torch::cat(v, 0);
  };
  std::vector<Verdict> vs;
  vs.push_back(gemm_check("c", out.c, cat(c, M), cat(cm, M), K));
  vs.push_back(gemm_check("grad_a", out.grad_a, cat(ga, K), cat(gam, K), M));
  // grad_b sums over the expert's rows: at most max(count) terms.
  const int64_t max_rows = std::get<0>(in.counts.max(0)).item<int64_t>();
  vs.push_back(gemm_check("grad_b", out.grad_b, gb, gbm, std::max<int64_t>(max_rows, 1)));
  Verdict ev{"grad_b_empty", static_cast<int64_t>(empty.size()), 0, ""};
  for (int64_t e : empty) {
    if (!out.grad_b[e].eq(0).all().item<bool>()) {
      ++ev.failed;
      if (ev.detail.empty()) ev.detail = "expert " + std::to_string(e) + " has no rows";
    }
  }
  if (ev.failed) ev.detail += ": its weight gradient is not exactly zero";
  vs.push_back(ev);
  return vs;
}

ExpertsInputs make_experts_inputs(int64_t experts, const torch::Device& device) {
  torch::manual_seed(experts * 7 + 3);
  const int64_t d = 256, f = 512;
  ExpertsInputs in;
  in.counts = torch::randint(1, 300, {experts}, torch::kLong);  // every expert gets rows
  const int64_t N = in.counts.sum().item<int64_t>();
  in.x = torch::randn({N, d}).to(device);
  in.w_gate = (torch::randn({experts, d, f}) * 0.05).to(device);
  in.w_up = (torch::randn({experts, d, f}) * 0.05).to(device);
  in.w_down = (torch::randn({experts, f, d}) * 0.05).to(device);
  in.grad_y = torch::randn({N, d}).to(device);
  in.counts = in.counts.to(device);
  return in;
}

std::vector<Verdict> check_experts(const ExpertsInputs& in, const ExpertsOutputs& out) {
  // The bf16 path rounds to bf16 at: the inputs and weights, each GEMM output, silu(gate), the
  // product h, and in the backward each gradient GEMM output: also each of the two partials of
  // grad_x (gate and up GEMMs), which autograd then adds; with fused_gate_up one GEMM over
  // [gate | up] gives grad_x in one rounding. The oracle is that graph in double with
  // a bf16 round trip at the same points (autograd rounds the gradients there too; round_bf16 of
  // a bf16-exact tensor is the identity forward and rounds its gradient backward). Kernel and
  // oracle then differ by fp32-vs-double accumulation, far below a bf16 ulp, except where an
  // intermediate lands on a rounding boundary and rounds the other way: one term a*b of a later
  // GEMM moves by 1 ulp of a or b (<= 2^-7 |a*b|). Tolerance per output element:
  //   2 ulp_bf16(|ref|) + 2^-7 rms(ref) + 2^-6 M
  // where M bounds that element's largest GEMM term |a*b| (row max times column max of the two
  // operands): the rms term covers scattered flips among typical terms, the M term two flips on
  // the largest one (the first GPU run, 2026-11-30, had single elements with one flip on an
  // extreme term 1.1-1.25x over the rms term alone). A wiring error (transpose, expert offset,
  // missing row) moves an element by about rms(ref), tens of times more.
  const auto f64 = torch::kDouble;
  auto round_bf16 = [](const torch::Tensor& t) {
    return t.to(torch::kBFloat16).to(torch::kDouble);
  };
  auto amax_rows = [](const torch::Tensor& t) { return t.abs().amax(1); };  // [n, k] -> [n]
  auto amax_cols = [](const torch::Tensor& t) { return t.abs().amax(0); };  // [n, k] -> [k]
  auto x = in.x.to(f64).detach().requires_grad_(true);
  auto wg = in.w_gate.to(f64).detach().requires_grad_(true);
  auto wu = in.w_up.to(f64).detach().requires_grad_(true);
  auto wd = in.w_down.to(f64).detach().requires_grad_(true);
  auto xb = round_bf16(x), gb = round_bf16(wg), ub = round_bf16(wu), db = round_bf16(wd);
  const auto gy = round_bf16(in.grad_y.to(f64));
  const int64_t f = in.w_gate.size(2);
  // The GEMM outputs before rounding, per expert with rows: [gate | up] (fused_gate_up: one
  // GEMM, so one rounding of grad_x's single partial), or gate and up (two partials).
  std::vector<torch::Tensor> ys, mm, hs;
  const auto segs = segments(in.counts);
  for (size_t e = 0; e < segs.size(); ++e) {
    auto [off, n] = segs[e];
    if (n == 0) continue;
    auto xs = xb.narrow(0, off, n);
    const auto ei = static_cast<int64_t>(e);
    torch::Tensor g, up;
    if (in.fused_gate_up) {
      mm.push_back(round_bf16(xs).mm(torch::cat({gb[ei], ub[ei]}, 1)));
      g = round_bf16(mm.back().narrow(1, 0, f));
      up = round_bf16(mm.back().narrow(1, f, f));
    } else {
      mm.push_back(round_bf16(xs).mm(gb[ei]));
      g = round_bf16(mm.back());
      mm.push_back(round_bf16(xs).mm(ub[ei]));
      up = round_bf16(mm.back());
    }
    hs.push_back(round_bf16(round_bf16(torch::silu(g)) * up));
    ys.push_back(round_bf16(hs.back().mm(db[ei])));
  }
  auto y = torch::cat(ys, 0);
  // Gradients at the GEMM outputs too: the operands of the weight and input gradient GEMMs.
  std::vector<torch::Tensor> wrt = {x, wg, wu, wd};
  wrt.insert(wrt.end(), mm.begin(), mm.end());
  auto grads = torch::autograd::grad({y}, wrt, {gy});
  // grads of expert k's gate and up GEMM outputs
  auto gemm_grads = [&](size_t k) -> std::pair<torch::Tensor, torch::Tensor> {
    if (in.fused_gate_up) {
      const auto& both = grads[4 + k];
      return {both.narrow(1, 0, f), both.narrow(1, f, f)};
    }
    return {grads[4 + 2 * k], grads[4 + 2 * k + 1]};
  };
  // M per element, per expert (experts without rows have zero weight gradients: M = 0).
  std::vector<torch::Tensor> m_y, m_x;
  auto m_wg = torch::zeros_like(wg), m_wu = torch::zeros_like(wu), m_wd = torch::zeros_like(wd);
  torch::NoGradGuard no_grad;
  size_t k = 0;
  for (size_t e = 0; e < segs.size(); ++e) {
    auto [off, n] = segs[e];
    if (n == 0) continue;
    const auto ei = static_cast<int64_t>(e);
    const auto xs = xb.narrow(0, off, n), gys = gy.narrow(0, off, n), h = hs[k].detach();
    const auto [gg, gu] = gemm_grads(k);
    m_y.push_back(amax_rows(h).unsqueeze(1) * amax_cols(db[ei]).unsqueeze(0));
    m_x.push_back(amax_rows(gg).unsqueeze(1) * amax_rows(gb[ei]).unsqueeze(0) +
                  amax_rows(gu).unsqueeze(1) * amax_rows(ub[ei]).unsqueeze(0));
    m_wg[ei] = amax_cols(xs).unsqueeze(1) * amax_cols(gg).unsqueeze(0);
    m_wu[ei] = amax_cols(xs).unsqueeze(1) * amax_cols(gu).unsqueeze(0);
    m_wd[ei] = amax_cols(h).unsqueeze(1) * amax_cols(gys).unsqueeze(0);
    ++k;
  }
  auto check = [](const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
                  const torch::Tensor& m) {
    auto rms = ref.square().mean().sqrt();
    return within(name, got, ref, 2 * ulp(ref, torch::kBFloat16) + 0x1p-7 * rms + 0x1p-6 * m);
  };
  return {check("y", out.y, y.detach(), torch::cat(m_y, 0)),
          check("grad_x", out.grad_x, grads[0], torch::cat(m_x, 0)),
          check("grad_w_gate", out.grad_w_gate, grads[1], m_wg),
          check("grad_w_up", out.grad_w_up, grads[2], m_wu),
          check("grad_w_down", out.grad_w_down, grads[3], m_wd)};
}

}  // namespace moe::kernel_checks
