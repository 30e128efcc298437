#include "kernel_checks.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "moe/moe/dispatcher.h"
#include "moe/moe/router.h"

namespace moe::kernel_checks {

using torch::indexing::Slice;

// ---- verdicts -------------------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  os << v.name << ": " << v.failed << " of " << v.checked << " failed";
  if (!v.detail.empty()) os << "; " << v.detail;
  return os;
}

bool all_ok(const std::vector<Verdict>& vs, std::string* message) {
  std::ostringstream os;
  bool ok = true;
  for (const auto& v : vs) {
    if (v.ok()) continue;
    ok = false;
    os << v << "\n";
  }
  if (message) *message = os.str();
  return ok;
}

const Verdict& find(const std::vector<Verdict>& vs, const std::string& name) {
  for (const auto& v : vs) {
    if (v.name == name) return v;
  }
  throw std::runtime_error("no verdict named " + name);
}

torch::Tensor ulp(const torch::Tensor& m, torch::ScalarType dtype) {
  int mantissa = 23, min_exp = -126;  // explicit mantissa bits, smallest normal exponent
  if (dtype == torch::kBFloat16) mantissa = 7;
  if (dtype == torch::kHalf) mantissa = 10, min_exp = -14;
  if (dtype == torch::kDouble) mantissa = 52, min_exp = -1022;
  auto a = m.to(torch::kDouble).abs();
  auto [frac, exp] = torch::frexp(a);  // a = frac * 2^exp, frac in [0.5, 1)
  auto e = (exp.to(torch::kDouble) - 1).clamp_min(min_exp);
  e = torch::where(a == 0, torch::full_like(e, min_exp), e);
  return torch::pow(2.0, e - mantissa);
}

namespace {

std::string describe_at(const torch::Tensor& shape_of, int64_t flat) {
  std::ostringstream os;
  os << "[";
  int64_t rest = flat;
  std::vector<int64_t> idx(static_cast<size_t>(shape_of.dim()));
  for (int64_t i = shape_of.dim() - 1; i >= 0; --i) {
    idx[static_cast<size_t>(i)] = rest % shape_of.size(i);
    rest /= shape_of.size(i);
  }
  for (size_t i = 0; i < idx.size(); ++i) os << (i ? ", " : "") << idx[i];
  os << "]";
  return os.str();
}

Verdict shape_mismatch(const std::string& name, const torch::Tensor& got,
                       const torch::Tensor& want) {
  Verdict v{name, 1, 1, ""};
  std::ostringstream os;
  if (!got.defined()) {
    os << "no output";
  } else {
    os << "shape " << got.sizes() << ", expected " << want.sizes();
  }
  v.detail = os.str();
  return v;
}

}  // namespace

Verdict exact(const std::string& name, const torch::Tensor& got, const torch::Tensor& want) {
  if (!got.defined() || got.sizes() != want.sizes()) return shape_mismatch(name, got, want);
  Verdict v{name, want.numel(), 0, ""};
  auto g = got.to(want.device(), want.scalar_type());
  auto bad = (g != want).reshape(-1);
  v.failed = bad.sum().item<int64_t>();
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os << "first at " << describe_at(want, i) << ": got " << g.reshape(-1)[i].item<double>()
       << ", expected " << want.reshape(-1)[i].item<double>();
    v.detail = os.str();
  }
  return v;
}

Verdict within(const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
               const torch::Tensor& tol) {
  if (!got.defined() || got.sizes() != ref.sizes()) return shape_mismatch(name, got, ref);
  Verdict v{name, ref.numel(), 0, ""};
  auto g = got.to(ref.device(), torch::kDouble);
  auto diff = (g - ref).abs();
  if (ref.numel() > 0) {
    auto ulps = (tol / ulp(ref, got.scalar_type())).reshape(-1);
    v.tightest = ulps.argmin().item<int64_t>();
    v.tightest_ulps = ulps[v.tightest].item<double>();
  }
  auto bad = (~(diff <= tol)).reshape(-1);  // NaN compares false: fails
  v.failed = bad.sum().item<int64_t>();
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream os;
    os.precision(9);
    os << "first at " << describe_at(ref, i) << ": got " << g.reshape(-1)[i].item<double>()
       << ", reference " << ref.reshape(-1)[i].item<double>() << ", |diff| "
       << diff.reshape(-1)[i].item<double>() << " > tolerance "
       << tol.reshape(-1)[i].item<double>();
    v.detail = os.str();
  }
  return v;
}

// ---- grids ----------------------------------------------------------------------------------

namespace {
const char* dtype_name(torch::ScalarType t) {
  return t == torch::kFloat ? "fp32" : t == torch::kHalf ? "fp16" : "bf16";
}
}  // namespace

std::vector<PermuteCase> permute_cases() {
  std::vector<PermuteCase> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const PlanCase& p : plan_cases()) v.push_back({dt, p.tokens, p.experts, p.k});
  }
  return v;
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> v;
  for (int64_t t : {1, 7, 4096, 65537}) {
    for (int64_t e : {1, 8, 64, 256}) {
      for (int64_t k : {1, 2, 8}) {
        if (k <= e) v.push_back({t, e, k});
      }
    }
  }
  return v;
}

std::vector<RouterCase> router_cases() {
  std::vector<RouterCase> v;
  for (const PermuteCase& p : permute_cases()) {
    v.push_back({p.dtype, p.tokens, p.experts, p.k, false, false});
    if (p.dtype == torch::kFloat) {  // score function and bias: once per shape
      v.push_back({p.dtype, p.tokens, p.experts, p.k, true, false});
      v.push_back({p.dtype, p.tokens, p.experts, p.k, false, true});
    }
  }
  return v;
}

std::string case_name(const PermuteCase& c) {
  return std::string(dtype_name(c.dtype)) + "_" + case_name(PlanCase{c.tokens, c.experts, c.k});
}

std::string case_name(const PlanCase& c) {
  return "T" + std::to_string(c.tokens) + "_E" + std::to_string(c.experts) + "_k" +
         std::to_string(c.k);
}

std::string case_name(const RouterCase& c) {
  return case_name(PermuteCase{c.dtype, c.tokens, c.experts, c.k}) + (c.sigmoid ? "_sigmoid" : "") +
         (c.bias ? "_bias" : "");
}

// ---- permute / combine ----------------------------------------------------------------------

PermuteInputs make_permute_inputs(const PermuteCase& c, const torch::Device& device) {
  PermuteInputs in;
  in.tokens = c.tokens;
  in.k = std::min(c.k, c.experts);
  const int64_t T = c.tokens, k = in.k, d = in.d;
  torch::manual_seed(T * 31 + c.experts * 7 + k);
  auto [w, idx] = moe::topk_lower_id_wins(torch::softmax(torch::randn({T, c.experts}), -1), k);
  auto keep = torch::rand({T, k}) > 0.1;
  moe::DispatchPlan plan = moe::plan_dispatch(idx, keep, c.experts);
  const int64_t N = plan.source_token.numel();
  auto rows = torch::full({T * k}, -1, torch::kLong);
  rows.index_put_({plan.source_assignment}, torch::arange(N));
  in.x = torch::randn({T, d}).to(c.dtype).to(device);
  in.source_token = plan.source_token.to(device);
  in.source_assignment = plan.source_assignment.to(device);
  in.rows_of_assignment = rows.to(device);
  in.y = torch::randn({N, d}).to(c.dtype).to(device);
  in.weights = (w * keep).contiguous().to(device);
  in.grad_out = torch::randn({T, d}).to(c.dtype).to(device);
  in.grad_permuted = torch::randn({N, d}).to(c.dtype).to(device);
  return in;
}

std::vector<Verdict> check_permute(const PermuteInputs& in, const PermuteOutputs& out) {
  const int64_t T = in.tokens, k = in.k, d = in.d;
  const auto dtype = in.x.scalar_type();
  const auto f64 = torch::kDouble;
  std::vector<Verdict> vs;
  vs.push_back(exact("rows", out.rows_of_assignment, in.rows_of_assignment));
  // Forward permute is a copy: bitwise.
  vs.push_back(exact("permute", out.permuted, in.x.index_select(0, in.source_token)));

  // The kernels sum token t's k contributions j = 0..k-1 in an fp32 register and round once to
  // the output dtype. Against the exact (double) sum: each fp32 add or fma rounds with relative
  // error <= u = 2^-24 of the partial sum it produces, so |acc - exact| <= u * sum_j |partial_j|
  // (first-order, over the steps that round), and the final rounding adds <= 1/2 ulp of the
  // output dtype (1 ulp covers a result that rounds into the next binade). Tolerance per element:
  //   ulp_dtype(|exact|) + 2 u sum_j |partial_j|.
  // Assignments are walked in the kernel's order j = 0..k-1, one [T, d] slice at a time (the
  // [T, k, d] tensor would be 270 MB in double at T = 65537, k = 8); dropped ones (row -1) read
  // an appended zero row, add nothing and round nothing.
  const int64_t N = in.source_token.numel();
  auto rows = in.rows_of_assignment.view({T, k});
  auto kept = rows.ge(0);
  auto index = torch::where(kept, rows, torch::full_like(rows, N));
  auto accumulation_check = [&](const std::string& name, const torch::Tensor& got,
                                const torch::Tensor& values, const torch::Tensor& scale,
                                bool first_add_rounds) {
    auto padded = torch::cat({values.to(f64), torch::zeros({1, d}, values.options().dtype(f64))});
    auto partial = torch::zeros({T, d}, padded.options());
    auto bound = torch::zeros({T, d}, padded.options());
    auto added = torch::zeros({T, 1}, kept.options());
    for (int64_t j = 0; j < k; ++j) {
      auto term = padded.index_select(0, index.select(1, j));
      if (scale.defined()) term = term * scale.select(1, j).unsqueeze(1).to(f64);
      partial += term;
      auto kept_j = kept.select(1, j).unsqueeze(1);
      // Adding the first term to 0.f is exact; an fma w * y + 0 rounds the product.
      auto rounds = first_add_rounds ? kept_j : kept_j & added;
      bound += partial.abs() * rounds;
      added = added | kept_j;
    }
    auto tol = ulp(partial, dtype) + 2 * kU32 * bound;
    return within(name, got, partial, tol);
  };
  vs.push_back(
      accumulation_check("permute_bwd", out.grad_x, in.grad_permuted, torch::Tensor(), false));
  vs.push_back(accumulation_check("combine", out.combined, in.y, in.weights, true));

  // Combine backward, row r (assignment a of token t): grad_y[r] = w[a] * grad_out[t], one fp32
  // product then one rounding to the dtype: within 1 ulp of the exact product.
  auto go_rows = in.grad_out.to(f64).index_select(0, in.source_token);
  auto w_rows = in.weights.reshape(-1).to(f64).index_select(0, in.source_assignment).unsqueeze(1);
  auto gy_ref = w_rows * go_rows;
  vs.push_back(within("combine_bwd_y", out.grad_y, gy_ref, ulp(gy_ref, dtype)));
  // grad_w[a] = dot(grad_out[t], y[r]) over d: each of 256 threads runs an fma chain over
  // ceil(d / 256) elements, then a fixed 8-level tree adds the partials. Every term passes
  // through at most n = ceil(d / 256) + 8 roundings: |err| <= n u sum_c |g_c y_c| (+ a margin
  // for the second order). Dropped assignments get exactly 0.
  auto prods = go_rows * in.y.to(f64);
  const double n_round = static_cast<double>((d + 255) / 256 + 8);
  auto dot_tol = 1.01 * n_round * kU32 * prods.abs().sum(1);
  auto gw_ref = torch::zeros({T * k}, prods.options());
  gw_ref.index_put_({in.source_assignment}, prods.sum(1));
  auto gw_tol = torch::zeros({T * k}, prods.options());
  gw_tol.index_put_({in.source_assignment}, dot_tol);
  vs.push_back(within("combine_bwd_w", out.grad_w.reshape(-1), gw_ref, gw_tol));
  return vs;
}

// ---- dispatch plan --------------------------------------------------------------------------

torch::Tensor make_plan_topk(const PlanCase& c, const torch::Device& device) {
  const int64_t k = std::min(c.k, c.experts);
  torch::manual_seed(c.tokens * 17 + c.experts * 3 + k);
  auto logits = torch::randn({c.tokens, c.experts});
  logits.select(1, 0).add_(1.0);
  return moe::topk_lower_id_wins(torch::softmax(logits, -1), k).second.contiguous().to(device);
}

std::vector<Verdict> check_plan(const torch::Tensor& topk_idx, int64_t num_experts,
                                const PlanOutputs& got) {
  auto keep = torch::ones(topk_idx.sizes(), topk_idx.options().dtype(torch::kBool));
  moe::DispatchPlan ref = moe::plan_dispatch(topk_idx, keep, num_experts);
  return {exact("source_token", got.source_token, ref.source_token),
          exact("source_assignment", got.source_assignment, ref.source_assignment),
          exact("tokens_per_expert", got.tokens_per_expert, ref.tokens_per_expert)};
}

// ---- router ---------------------------------------------------------------------------------

RouterInputs make_router_inputs(const RouterCase& c, const torch::Device& device) {
  RouterInputs in;
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

std::vector<Verdict> check_router(const RouterInputs& in, const RouterOutputs& out, int64_t* ties) {
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
  // NaN keys rank lowest, as in the kernel and moe::score_and_select_reference.
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

// ---- grouped GEMM and experts ---------------------------------------------------------------

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
  // grad_x (gate and up GEMMs), which autograd then adds. The oracle is that graph in double with
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
  std::vector<torch::Tensor> ys, gate_mm, up_mm, hs;
  const auto segs = segments(in.counts);
  for (size_t e = 0; e < segs.size(); ++e) {
    auto [off, n] = segs[e];
    if (n == 0) continue;
    auto xs = xb.narrow(0, off, n);
    const auto ei = static_cast<int64_t>(e);
    gate_mm.push_back(round_bf16(xs).mm(gb[ei]));
    up_mm.push_back(round_bf16(xs).mm(ub[ei]));
    auto g = round_bf16(gate_mm.back());
    auto up = round_bf16(up_mm.back());
    hs.push_back(round_bf16(round_bf16(torch::silu(g)) * up));
    ys.push_back(round_bf16(hs.back().mm(db[ei])));
  }
  auto y = torch::cat(ys, 0);
  // Gradients at the GEMM outputs too: the operands of the weight and input gradient GEMMs.
  std::vector<torch::Tensor> wrt = {x, wg, wu, wd};
  wrt.insert(wrt.end(), gate_mm.begin(), gate_mm.end());
  wrt.insert(wrt.end(), up_mm.begin(), up_mm.end());
  auto grads = torch::autograd::grad({y}, wrt, {gy});
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
    const auto gg = grads[4 + k], gu = grads[4 + gate_mm.size() + k];
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
