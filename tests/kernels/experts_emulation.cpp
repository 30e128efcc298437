// CPU emulation of the experts family (experts_emulation.h): bf16 grouped GEMMs with fp32
// accumulation, and the bf16 experts module with bf16 rounding where that path rounds.
#include "experts_emulation.h"

#include <torch/torch.h>

#include <vector>

namespace moe::kernel_emulation {

using namespace kernel_checks;

GroupedGemmOutputs grouped_gemm(const GroupedGemmInputs& in) {
  const int64_t E = in.b.size(0), N = in.a.size(0);
  auto counts = in.counts.to(torch::kCPU);
  std::vector<torch::Tensor> c, ga;
  auto gb = torch::zeros_like(in.b);
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    auto a = in.a.narrow(0, off, n).to(torch::kFloat);
    auto g = in.grad_c.narrow(0, off, n).to(torch::kFloat);
    auto b = in.b[e].to(torch::kFloat);
    c.push_back(a.mm(b).to(torch::kBFloat16));
    ga.push_back(g.mm(b.t()).to(torch::kBFloat16));
    gb[e] = a.t().mm(g).to(torch::kBFloat16);
    off += n;
  }
  auto cat = [&](std::vector<torch::Tensor>& v, int64_t cols) {
    return v.empty() ? torch::zeros({N, cols}, in.a.options()) : torch::cat(v, 0);
  };
  return {cat(c, in.b.size(2)), cat(ga, in.b.size(1)), gb};
}

ExpertsOutputs experts(const ExpertsInputs& in) {
  auto round_bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  auto x = in.x.detach().requires_grad_(true);
  auto wg = in.w_gate.detach().requires_grad_(true);
  auto wu = in.w_up.detach().requires_grad_(true);
  auto wd = in.w_down.detach().requires_grad_(true);
  auto xb = round_bf16(x), gb = round_bf16(wg), ub = round_bf16(wu), db = round_bf16(wd);
  auto counts = in.counts.to(torch::kCPU);
  std::vector<torch::Tensor> ys;
  int64_t off = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    auto xs = xb.narrow(0, off, n);
    // round_bf16(xs): the identity forward; backward, each GEMM's partial of grad_x is rounded
    // to bf16 before autograd adds the two, as in the bf16 path; with fused_gate_up there is one
    // GEMM over [gate | up], one partial, one rounding.
    torch::Tensor g, up;
    if (in.fused_gate_up) {
      const int64_t f = gb.size(2);
      const auto both = round_bf16(round_bf16(xs).mm(torch::cat({gb[e], ub[e]}, 1)));
      g = both.narrow(1, 0, f);
      up = both.narrow(1, f, f);
    } else {
      g = round_bf16(round_bf16(xs).mm(gb[e]));
      up = round_bf16(round_bf16(xs).mm(ub[e]));
    }
    auto h = round_bf16(round_bf16(torch::silu(g)) * up);
    ys.push_back(round_bf16(h.mm(db[e])));
    off += n;
  }
  auto y = torch::cat(ys, 0);
  auto grads = torch::autograd::grad({y}, {x, wg, wu, wd}, {in.grad_y});
  return {y.detach(), grads[0], grads[1], grads[2], grads[3]};
}

}  // namespace moe::kernel_emulation
