// The router family's oracle and tolerances (router_checks.h): score_and_select's scores,
// selection (up to the tie gap), gate weights, counts and gradient in double precision.
#include "router_checks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moe/moe/router.h"

namespace moe::kernel_checks {

ScoreAndSelectInputs make_score_and_select_inputs(const RouterCase& c,
                                                  const torch::Device& device) {
  ScoreAndSelectInputs in;
  const int64_t T = c.tokens, E = c.experts;
  in.k = std::min(c.k, E);
  in.sigmoid = c.sigmoid;
  torch::manual_seed(T * 13 + E * 5 + in.k + (c.sigmoid ? 1000 : 0) + (c.bias ? 2000 : 0));
  in.logits = (torch::randn({T, E}) * 2).to(c.dtype).to(torch::kFloat).to(device);
  if (c.bias) in.bias = (torch::rand({E}) * 0.1).to(device);
  in.grad_probs = (torch::randn({T, E}) * 1e-2).to(device);
  in.grad_weight = torch::randn({T, in.k}).to(device);
  in.grad_lse = (torch::randn({T}) * 1e-3).to(device);
  return in;
}

std::vector<Verdict> check_score_and_select(const ScoreAndSelectInputs& in,
                                            const ScoreAndSelectOutputs& out, int64_t* ties) {
  const int64_t T = in.logits.size(0), E = in.logits.size(1), k = in.k;
  const double u = kU32;
  const bool normalize = in.normalize && (k > 1 || in.sigmoid);
  std::vector<Verdict> vs;
  auto v = in.logits.to(torch::kDouble);
  auto m = std::get<0>(v.max(1, true));
  auto vmin = std::get<0>(v.min(1, true));
  auto p = in.sigmoid ? torch::sigmoid(v) : torch::softmax(v, 1);
  auto soft = in.sigmoid ? torch::softmax(v, 1) : p;
  auto lse = torch::logsumexp(v, 1);

  // Relative error of the kernel's fp32 scores, per token (CUDA expf: <= 2 ulp = 4u; its
  // argument v - m or -v rounds with absolute error u |v - m|, relative error of the exp):
  //   softmax p = expf(v - m) / s: exp (4u + u|v-m|), s (the same for its largest term, plus
  //     a 5-level warp tree and E/32 lane adds: <= 5 + 8 roundings), the division (u):
  //     rtol = (24 + 2 max|v - m|) u
  //   sigmoid p = 1 / (1 + expf(-v)): rtol = (8 + max|v|) u
  auto rtol = in.sigmoid ? (8 + std::get<0>(v.abs().max(1, true))) * u : (24 + 2 * (m - vmin)) * u;
  vs.push_back(within("probs", out.probs, p, rtol * p));
  // lse = m + logf(s): the relative error of s becomes an absolute one, logf and the add round.
  vs.push_back(within("lse", out.lse, lse, rtol.squeeze(1) + 4 * u * (lse.abs() + 1)));

  // Selection happens on keys = scores (+ bias). Kernel keys differ from the exact ones by at
  // most rtol * p (+ the fp32 add of the bias: u |key|); two keys closer than twice that may
  // rank either way ("tie gap"). The kernel's ids must be k distinct ids in [0, E), ranked
  // within the gap, and none left out may beat a chosen one by more than the gap. Tokens whose
  // ids differ from the exact ranking while meeting that are ties; any other token fails.
  // NaN keys rank lowest, as in the kernel and moe::score_and_select.
  auto keys = in.bias.defined() ? p + in.bias.to(torch::kDouble) : p;
  keys = keys.masked_fill(keys.isnan(), -INFINITY);
  auto gap =
      2 * (rtol * std::get<0>(p.max(1, true)) + 2 * u * std::get<0>(keys.abs().max(1, true)));
  auto ids = out.topk_idx.to(in.logits.device(), torch::kLong);
  Verdict sel{"selection", T, 0, ""};
  if (!ids.defined() || ids.sizes() != torch::IntArrayRef({T, k})) {
    vs.push_back(shape_mismatch("selection", ids, torch::empty({T, k})));
    return vs;
  }
  auto in_range = ((ids >= 0) & (ids < E)).all(1);
  auto safe = ids.clamp(0, E - 1);
  auto chosen = torch::zeros({T, E}, keys.options().dtype(torch::kBool)).scatter(1, safe, true);
  auto distinct = chosen.sum(1).eq(k);
  auto chosen_keys = keys.gather(1, safe);
  auto ranked =
      k > 1 ? (chosen_keys.narrow(1, 0, k - 1) >= chosen_keys.narrow(1, 1, k - 1) - gap).all(1)
            : torch::ones({T}, in_range.options());
  auto best_left = k < E ? std::get<0>(keys.masked_fill(chosen, -INFINITY).max(1))
                         : torch::full({T}, -INFINITY, keys.options());
  auto complete = std::get<0>(chosen_keys.min(1)) >= best_left - gap.squeeze(1);
  auto good = in_range & distinct & ranked & complete;
  auto exact_rank = moe::topk_lower_id_wins(keys, k).second;
  const int64_t differ = (ids != exact_rank).any(1).sum().item<int64_t>();
  sel.failed = (~good).sum().item<int64_t>();
  if (ties) *ties = differ - sel.failed;
  if (sel.failed > 0) {
    const int64_t t = (~good).nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os.precision(9);
    os << "token " << t << ": ids " << ids[t] << " keys " << keys[t].index_select(0, safe[t])
       << " vs exact ranking " << exact_rank[t] << " keys "
       << keys[t].index_select(0, exact_rank[t]) << ", tie gap " << gap[t].item<double>();
    sel.detail = os.str();
  }
  vs.push_back(sel);

  // Gate weights of the kernel's own choice: p at the chosen ids (divided by their sum): the
  // scores' error twice (numerator, sum) plus k adds and the division.
  auto pw = p.gather(1, safe);
  auto w_ref = normalize ? pw / pw.sum(1, true).clamp_min(1e-20) : pw;
  vs.push_back(within("topk_weight", out.topk_weight, w_ref, (2 * rtol + (k + 2) * u) * w_ref));
  vs.push_back(exact("tokens_per_expert", out.tokens_per_expert.to(ids.device()),
                     torch::bincount(ids.clamp(0, E - 1).reshape(-1), {}, E)));

  if (!out.grad_logits.defined()) return vs;
  // Backward (vector-Jacobian product at the kernel's choice), exactly:
  //   G_e = grad_probs_e + sum_j [id_j = e] (normalize ? (gw_j - sum_m gw_m w_m) / S : gw_j)
  //   softmax: grad_v = p (G - sum G p) + grad_lse p;  sigmoid: G p (1 - p) + grad_lse soft(v)
  // Tolerance from the magnitudes the kernel adds up (M below, the same formulas on absolute
  // values): its fp32 probs (rtol, used twice), the weight path (k + 2 roundings), the
  // E-long warp dot product (log2 E + E/32 + 5), and the final fma: (4 rtol + (16 + 2k + 8) u) M.
  auto gw = in.grad_weight.to(torch::kDouble);
  auto gp = in.grad_probs.defined() ? in.grad_probs.to(torch::kDouble) : torch::zeros_like(p);
  auto gl = in.grad_lse.defined() ? in.grad_lse.to(torch::kDouble).unsqueeze(1)
                                  : torch::zeros({T, 1}, p.options());
  auto S = pw.sum(1, true).clamp_min(1e-20);
  auto dot_w = (gw * w_ref).sum(1, true);
  auto add = normalize ? (gw - dot_w) / S : gw;
  auto add_mag = normalize ? (gw.abs() + (gw * w_ref).abs().sum(1, true)) / S : gw.abs();
  auto G = gp.scatter_add(1, safe, add);
  auto G_mag = gp.abs().scatter_add(1, safe, add_mag);
  torch::Tensor grad_ref, mag;
  if (in.sigmoid) {
    grad_ref = G * p * (1 - p) + gl * soft;
    mag = G_mag * p + gl.abs() * soft;
  } else {
    grad_ref = p * (G - (G * p).sum(1, true)) + gl * p;
    mag = p * (G_mag + (G_mag * p).sum(1, true)) + gl.abs() * p;
  }
  auto grad_tol = (4 * rtol + (24.0 + 2 * k) * u) * mag + 1e-40;
  vs.push_back(within("grad_logits", out.grad_logits, grad_ref, grad_tol));
  return vs;
}

}  // namespace moe::kernel_checks
