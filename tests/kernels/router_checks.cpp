// The router family's oracle and tolerances (router_checks.h): score_and_select's scores,
// selection (up to the tie gap), gate weights, counts and gradient in double precision.
#include "router_checks.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

std::vector<RouterGroupCase> router_group_cases() {
  using L = RouterLogits;
  return {
      // DeepSeek-V3 (Kimi K2, Moonlight alike): 256 experts in 8 groups, 4 kept, top-8, sigmoid
      // scores + e_score_correction_bias, a group's key the sum of its best two.
      {"deepseek_v3", 4096, 256, 8, 8, 4, 2, true, true, true},
      {"deepseek_v3_coarse", 4096, 256, 8, 8, 4, 2, true, true, true, L::kCoarse},
      {"deepseek_v3_nan", 257, 256, 8, 8, 4, 2, true, true, true, L::kNan},
      // GLM-4.5: 160 experts in one group, top-8, sigmoid + bias (the group arguments unused).
      {"glm45", 4096, 160, 8, 1, 1, 2, true, true, true},
      {"glm45_coarse", 4096, 160, 8, 1, 1, 2, true, true, true, L::kCoarse},
      // DeepSeek-V2's group_limited_greedy: 160 experts in 8 groups keyed by their best, 3 kept,
      // top-6, softmax, not renormalised.
      {"deepseek_v2", 4096, 160, 6, 8, 3, 1, false, false, false},
      {"deepseek_v2_coarse", 4096, 160, 6, 8, 3, 1, false, false, false, L::kCoarse},
      {"deepseek_v2_nan", 257, 160, 6, 8, 3, 1, false, false, false, L::kNan},
      // 8 experts in 4 groups of 2 (a group's second best is its other expert), 2 kept, top-2.
      {"tiny", 7, 8, 2, 4, 2, 2, false, false, true},
      {"tiny_sigmoid_coarse", 1024, 8, 2, 4, 2, 2, true, true, true, L::kCoarse},
      // 32 groups, one per lane: of 2 experts, and of 8 keyed by their best.
      {"groups32", 1024, 64, 8, 32, 5, 2, true, true, true, L::kCoarse},
      {"groups32_e256", 1024, 256, 4, 32, 3, 1, false, true, true},
      // Groups across lanes: 72 experts in 9 groups of 8 (E not a multiple of 32).
      {"e72_groups9", 1024, 72, 3, 9, 4, 2, false, true, true, L::kCoarse},
      // k beyond the kept experts: one group of 4 kept, top-8 (the other 4 at -inf, lowest ids).
      {"k_beyond_kept", 257, 16, 8, 4, 1, 2, true, false, true},
      // Every group kept: plain top-k.
      {"all_groups_kept", 257, 64, 8, 4, 4, 2, true, true, true},
      {"nan_small", 257, 32, 4, 4, 2, 2, true, true, true, L::kNan},
      // An infinite bias: group 1's key +inf + -inf = NaN ranks first (at::sort's NaN order),
      // and keyed by its best, +inf.
      {"inf_bias", 257, 32, 4, 4, 2, 2, true, true, true, L::kRandom, true},
      {"inf_bias_max", 257, 32, 4, 4, 2, 1, true, true, true, L::kRandom, true},
  };
}

ScoreAndSelectInputs make_score_and_select_inputs(const RouterGroupCase& c,
                                                  const torch::Device& device) {
  ScoreAndSelectInputs in;
  const int64_t T = c.tokens, E = c.experts, S = E / c.n_group;
  in.k = c.k;
  in.sigmoid = c.sigmoid;
  in.normalize = c.normalize;
  in.n_group = c.n_group;
  in.topk_group = c.topk_group;
  in.group_score_experts = c.group_score_experts;
  torch::manual_seed(T * 13 + E * 5 + c.k * 3 + c.n_group * 101 + c.topk_group * 7 +
                     c.group_score_experts * 1009 + static_cast<int64_t>(c.logits) * 10007 +
                     (c.sigmoid ? 1000 : 0) + (c.bias ? 2000 : 0));
  auto coarse = [&](int64_t rows) {
    return torch::randint(-3, 4, {rows, E}).to(torch::kFloat) * 0.5;
  };
  torch::Tensor logits = c.logits == RouterLogits::kCoarse ? coarse(T) : torch::randn({T, E}) * 2;
  if (c.logits == RouterLogits::kNan) {
    for (int64_t t = 0; t < T; ++t) {
      auto row = logits[t];
      switch (t % 5) {
        case 1:
          row.fill_(NAN);
          break;
        case 2:
          row.masked_fill_(torch::rand({E}) < 0.25, NAN);
          break;
        case 3:  // group 0 NaN, one +inf and one -inf logit (softmax: a NaN row)
          row.narrow(0, 0, S).fill_(NAN);
          row[E - 1] = INFINITY;
          row[S] = -INFINITY;
          break;
        case 4:
          row.copy_(coarse(1)[0]);
          break;
        default:
          break;
      }
    }
  }
  in.logits = logits.to(device);
  if (c.bias) {
    auto bias = c.logits == RouterLogits::kCoarse
                    ? torch::randint(0, 3, {E}).to(torch::kFloat) * 0.125
                    : torch::rand({E}) * 0.1;
    if (c.inf_bias) {
      bias.narrow(0, S, S).fill_(-INFINITY);
      bias[S] = INFINITY;
    }
    in.bias = bias.to(device);
  }
  in.grad_probs = (torch::randn({T, E}) * 1e-2).to(device);
  in.grad_weight = torch::randn({T, in.k}).to(device);
  in.grad_lse = (torch::randn({T}) * 1e-3).to(device);
  return in;
}

bool finite_inputs(const RouterGroupCase& c) { return c.logits != RouterLogits::kNan; }

namespace {

// Bit for bit, except that any NaN matches any NaN (fp32 tensors of one shape, any device).
Verdict bitwise(const std::string& name, const torch::Tensor& got, const torch::Tensor& want) {
  if (!got.defined() || got.sizes() != want.sizes()) return shape_mismatch(name, got, want);
  Verdict v{name, want.numel(), 0, ""};
  auto g = got.to(torch::kCPU, torch::kFloat).contiguous();
  auto w = want.to(torch::kCPU, torch::kFloat).contiguous();
  const float* gp = g.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (std::isnan(gp[i]) && std::isnan(wp[i])) continue;
    if (std::memcmp(gp + i, wp + i, sizeof(float)) == 0) continue;
    if (v.failed++ == 0) {
      std::ostringstream os;
      os.precision(9);
      os << "first at flat index " << i << ": got " << gp[i] << ", reference " << wp[i];
      v.detail = os.str();
    }
  }
  return v;
}

}  // namespace

std::vector<Verdict> check_against_reference(const ScoreAndSelectInputs& in,
                                             const ScoreAndSelectOutputs& out) {
  std::vector<Verdict> vs;
  const auto probs = out.probs.detach();
  const auto bias = in.bias.defined() ? in.bias.to(probs.device()) : in.bias;
  const auto ref = moe::select_experts(probs, bias, in.k, in.sigmoid, in.normalize, in.n_group,
                                       in.topk_group, in.group_score_experts);
  const auto ids = out.topk_idx.to(probs.device(), torch::kLong);
  Verdict v = exact("reference_ids", ids, ref.first);
  if (!v.ok() && ids.sizes() == ref.first.sizes()) {
    const int64_t t = (ids != ref.first).any(1).nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os << v.detail << "; token " << t << ": ids " << ids[t] << " vs the reference's "
       << ref.first[t];
    v.detail = os.str();
  }
  vs.push_back(v);
  // The weights from the reference on the CPU: ATen's CUDA sum may add the k weights in another
  // order than the kernel's j = 0..k-1.
  const auto ref_cpu =
      moe::select_experts(probs.cpu(), bias.defined() ? bias.cpu() : bias, in.k, in.sigmoid,
                          in.normalize, in.n_group, in.topk_group, in.group_score_experts);
  vs.push_back(bitwise("reference_weights", out.topk_weight, ref_cpu.second));
  const int64_t E = probs.size(1);
  vs.push_back(exact("reference_counts", out.tokens_per_expert.to(torch::kCPU, torch::kLong),
                     torch::bincount(ref_cpu.first.reshape(-1), {}, E)));
  return vs;
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
  // NaN keys rank lowest, as in the kernel and moe::score_and_select. With expert groups
  // (n_group > 1) the choice must be the reference's on the output's own scores instead, exactly:
  // a group's key sums two keys and decides which experts compete, so no gap bounds what one
  // rounding may move (the scores themselves are checked above).
  auto ids =
      out.topk_idx.defined() ? out.topk_idx.to(in.logits.device(), torch::kLong) : out.topk_idx;
  Verdict sel{"selection", T, 0, ""};
  if (!ids.defined() || ids.sizes() != torch::IntArrayRef({T, k})) {
    vs.push_back(shape_mismatch("selection", ids, torch::empty({T, k})));
    return vs;
  }
  auto in_range = ((ids >= 0) & (ids < E)).all(1);
  auto safe = ids.clamp(0, E - 1);
  if (in.n_group > 1) {
    const auto own = out.probs.detach().to(in.logits.device());
    const auto want = moe::select_experts(own, in.bias, k, in.sigmoid, in.normalize, in.n_group,
                                          in.topk_group, in.group_score_experts)
                          .first;
    auto bad = (ids != want).any(1) | ~in_range;
    sel.failed = bad.sum().item<int64_t>();
    if (ties) *ties = 0;
    if (sel.failed > 0) {
      const int64_t t = bad.nonzero()[0][0].item<int64_t>();
      std::ostringstream os;
      os << "token " << t << ": ids " << ids[t] << " vs the reference's " << want[t]
         << " on the same scores";
      sel.detail = os.str();
    }
  } else {
    auto keys = in.bias.defined() ? p + in.bias.to(torch::kDouble) : p;
    keys = keys.masked_fill(keys.isnan(), -INFINITY);
    auto gap =
        2 * (rtol * std::get<0>(p.max(1, true)) + 2 * u * std::get<0>(keys.abs().max(1, true)));
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
