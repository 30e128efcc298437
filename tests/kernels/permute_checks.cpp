// The permute family's oracles and tolerances (permute_checks.h): permute, combine and the
// dispatch plan against double-precision and stable-sort references.
#include "permute_checks.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "moe/kernels/permute_token.h"
#include "moe/moe/dispatcher.h"
#include "moe/moe/router.h"

namespace moe::kernel_checks {

// ---- permute / combine ----------------------------------------------------------------------

PermuteInputs make_permute_inputs(const PermuteCase& c, const torch::Device& device) {
  PermuteInputs in;
  in.tokens = c.tokens;
  in.k = std::min(c.k, c.experts);
  in.d = c.d;
  const int64_t T = c.tokens, k = in.k, d = in.d;
  torch::manual_seed(T * 31 + c.experts * 7 + k + (d != 64 ? d * 1009 : 0));
  auto [w, idx] = moe::topk_lower_id_wins(torch::softmax(torch::randn({T, c.experts}), -1), k);
  auto keep = torch::rand({T, k}) > 0.1;
  moe::DispatchPlan plan = moe::dispatch_plan(idx, keep, c.experts);
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
  // grad_w[a] = dot(grad_out[t], y[r]) over d: each of the token's lanes runs an fma chain over
  // its packs (moe/kernels/permute_token.h), then a butterfly of log2(lanes) levels adds the
  // lanes. Every term passes through at most n = (packs per lane) x (elements per pack) + levels
  // roundings, for either launch shape (16-byte packs or one element per thread):
  // |err| <= n u sum_c |g_c y_c| (+ a margin for the second order). Dropped assignments get
  // exactly 0.
  auto prods = go_rows * in.y.to(f64);
  double n_round = 0;
  for (bool packs : {true, false}) {
    const auto l = kernels::token_rows::token_layout(d, in.y.element_size(), packs);
    const int64_t per_lane = (l.row_vecs + l.lanes - 1) / l.lanes * l.vec;
    n_round = std::max(n_round,
                       static_cast<double>(per_lane + kernels::token_rows::reduce_levels(l.lanes)));
  }
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
  moe::DispatchPlan ref = moe::dispatch_plan(topk_idx, keep, num_experts);
  return {exact("source_token", got.source_token, ref.source_token),
          exact("source_assignment", got.source_assignment, ref.source_assignment),
          exact("tokens_per_expert", got.tokens_per_expert, ref.tokens_per_expert)};
}

}  // namespace moe::kernel_checks
