#include "moe/model/gated_delta_rule.h"
#include "moe/model/packed_documents.h"

#include <cmath>
#include <limits>

#include <torch/torch.h>

namespace moe::model {

namespace F = torch::nn::functional;

namespace {

constexpr double kDeltaRuleInfinity = std::numeric_limits<double>::infinity();

// The inputs as the rule computes with them: [B, Hv, S, .] fp32, key heads repeated over their
// value heads, q and k L2-normalised, q scaled by dk^-0.5.
struct DeltaRuleHeads {
  torch::Tensor q, k, v, g, beta;
};
DeltaRuleHeads head_major(const DeltaRuleInputs& in) {
  const int64_t Hk = in.k.size(2), Hv = in.v.size(2);
  auto q = in.q, k = in.k;
  if (Hk != Hv) {
    q = q.repeat_interleave(Hv / Hk, 2);
    k = k.repeat_interleave(Hv / Hk, 2);
  }
  const auto f32 = [](const torch::Tensor& x) {
    return x.transpose(1, 2).to(torch::kFloat).contiguous();
  };
  DeltaRuleHeads h{f32(q), f32(k), f32(in.v), f32(in.g), f32(in.beta)};
  h.q = delta_rule_l2norm(h.q);
  h.k = delta_rule_l2norm(h.k);
  h.q = h.q * std::pow(static_cast<double>(h.q.size(-1)), -0.5);
  return h;
}

}  // namespace

torch::Tensor delta_rule_l2norm(const torch::Tensor& x) {
  return x * torch::rsqrt((x * x).sum(-1, /*keepdim=*/true) + 1e-6);
}

DeltaRuleOutput chunk_gated_delta_rule(const DeltaRuleInputs& in, int64_t C) {
  const int64_t B = in.v.size(0), S = in.v.size(1), Hv = in.v.size(2), dv = in.v.size(3);
  const int64_t dk = in.k.size(3);
  auto h = head_major(in);
  const int64_t pad = (C - S % C) % C, N = (S + pad) / C;
  // Zero padding changes nothing before it: k = 0 stores nothing, g = 0 keeps the state.
  auto q = F::pad(h.q, F::PadFuncOptions({0, 0, 0, pad}));
  auto k = F::pad(h.k, F::PadFuncOptions({0, 0, 0, pad}));
  auto v = F::pad(h.v, F::PadFuncOptions({0, 0, 0, pad}));
  auto beta = F::pad(h.beta, F::PadFuncOptions({0, pad}));
  auto g = F::pad(h.g, F::PadFuncOptions({0, pad}));
  // The padding belongs to the last document, so the final state is the last token's.
  auto docs = document_ids(in.positions, B, S, in.v.device());
  if (pad > 0) docs = torch::cat({docs, docs.narrow(1, S - 1, 1).expand({B, pad})}, 1);
  docs = docs.view({B, 1, N, C});

  const auto k_beta = (k * beta.unsqueeze(-1)).view({B, Hv, N, C, dk});
  const auto v_beta = (v * beta.unsqueeze(-1)).view({B, Hv, N, C, dv});
  q = q.view({B, Hv, N, C, dk});
  k = k.view({B, Hv, N, C, dk});
  const auto cum = g.view({B, Hv, N, C}).cumsum(-1);

  // Token j reaches token i (j <= i) through exp(cum_i - cum_j), unless a document starts
  // between them; the state from before the chunk reaches i through exp(cum_i) unless one
  // starts up to i; token j reaches the chunk's last through exp(cum_last - cum_j) likewise.
  const auto causal = torch::ones({C, C}, docs.options().dtype(torch::kBool)).tril();
  const auto keep = docs.unsqueeze(-1).eq(docs.unsqueeze(-2)) & causal;  // [B, 1, N, C, C]
  const auto before = torch::cat(
      {docs.narrow(2, 0, 1).narrow(3, 0, 1), docs.narrow(2, 0, N - 1).narrow(3, C - 1, 1)},
      2);  // [B, 1, N, 1]: the document of the token before each chunk
  const auto carried = docs.eq(before);            // [B, 1, N, C]
  const auto last_doc = docs.narrow(3, C - 1, 1);  // [B, 1, N, 1]
  const auto reaches_last = docs.eq(last_doc);     // [B, 1, N, C]
  const auto pair_decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2))
                              .masked_fill(keep.logical_not(), -kDeltaRuleInfinity)
                              .exp();
  const auto from_state =
      cum.masked_fill(carried.logical_not(), -kDeltaRuleInfinity).exp();  // [B, H, N, C]
  const auto cum_last = cum.narrow(3, C - 1, 1);
  const auto to_last = (cum_last - cum)
                           .masked_fill(reaches_last.logical_not(), -kDeltaRuleInfinity)
                           .exp();  // [B, H, N, C]
  const auto chunk_decay =
      cum_last.squeeze(-1)
          .masked_fill(carried.narrow(3, C - 1, 1).squeeze(-1).logical_not(), -kDeltaRuleInfinity)
          .exp();  // [B, H, N]

  // The WY form: (I + strictly lower part of beta K K^T decayed) solves for the chunk's values
  // and for the state's decayed keys at once.
  const auto kkt = torch::matmul(k_beta, k.transpose(-1, -2)) * pair_decay;
  const auto intra = torch::matmul(q, k.transpose(-1, -2)) * pair_decay;
  const auto new_values =
      torch::linalg_solve_triangular(kkt, v_beta, /*upper=*/false, /*left=*/true,
                                     /*unitriangular=*/true);
  const auto k_cumdecay =
      torch::linalg_solve_triangular(kkt, k_beta * from_state.unsqueeze(-1), false, true, true);
  const auto q_state = q * from_state.unsqueeze(-1);
  const auto k_state = (k * to_last.unsqueeze(-1)).transpose(-1, -2);  // [B, H, N, dk, C]

  auto state = torch::zeros({B, Hv, dk, dv}, v.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const auto v_new = new_values.select(2, n) - torch::matmul(k_cumdecay.select(2, n), state);
    outs.push_back(torch::matmul(q_state.select(2, n), state) +
                   torch::matmul(intra.select(2, n), v_new));
    state = state * chunk_decay.select(2, n).unsqueeze(-1).unsqueeze(-1) +
            torch::matmul(k_state.select(2, n), v_new);
  }
  auto o = torch::stack(outs, 2).view({B, Hv, N * C, dv}).narrow(2, 0, S);
  return {o.transpose(1, 2).to(in.q.scalar_type()).contiguous(), state};
}

DeltaRuleOutput recurrent_gated_delta_rule(const DeltaRuleInputs& in,
                                           const torch::Tensor& initial_state) {
  const int64_t B = in.v.size(0), S = in.v.size(1), Hv = in.v.size(2), dv = in.v.size(3);
  const int64_t dk = in.k.size(3);
  const auto h = head_major(in);
  auto state = initial_state.defined() ? initial_state.to(torch::kFloat)
                                       : torch::zeros({B, Hv, dk, dv}, h.v.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t) {
    if (in.positions.defined()) {  // a document starts: nothing before it is remembered
      const auto keep = in.positions.select(1, t).ne(0).to(torch::kFloat);
      state = state * keep.view({B, 1, 1, 1});
    }
    const auto q_t = h.q.select(2, t), k_t = h.k.select(2, t), v_t = h.v.select(2, t);
    state = state * h.g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const auto predicted = (state * k_t.unsqueeze(-1)).sum(-2);
    const auto delta = (v_t - predicted) * h.beta.select(2, t).unsqueeze(-1);
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back((state * q_t.unsqueeze(-1)).sum(-2));
  }
  auto o = torch::stack(outs, 2);  // [B, H, S, dv]
  return {o.transpose(1, 2).to(in.q.scalar_type()).contiguous(), state};
}

torch::Tensor causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                 const torch::Tensor& positions, const torch::Tensor& bias) {
  const int64_t S = x.size(1), K = weight.size(2);
  const auto w = weight.squeeze(1).to(x.scalar_type());  // [C, K]
  // y_t = sum_i w[K - 1 - i] x_{t - i}, in nn.Conv1d's order (oldest tap first); a tap before
  // the token's document (position < i) or before the window reads zero.
  torch::Tensor y;
  for (int64_t i = K - 1; i >= 0; --i) {
    auto shifted = i == 0 ? x : F::pad(x, F::PadFuncOptions({0, 0, i, 0})).narrow(1, 0, S);
    if (i > 0 && positions.defined()) {
      shifted = shifted * positions.ge(i).unsqueeze(-1).to(x.scalar_type());
    }
    const auto tap = shifted * w.select(1, K - 1 - i);
    y = y.defined() ? y + tap : tap;
  }
  if (bias.defined()) y = y + bias.to(x.scalar_type());
  return torch::silu(y);
}

}  // namespace moe::model
