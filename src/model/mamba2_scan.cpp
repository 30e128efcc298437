#include "moe/model/mamba2_scan.h"
#include "moe/model/packed_documents.h"

#include <limits>
#include <vector>

#include <torch/torch.h>

namespace moe::model {

namespace F = torch::nn::functional;

namespace {

constexpr double kSsdInfinity = std::numeric_limits<double>::infinity();

// fp32, or fp64 for fp64 inputs (the tests' exact references).
torch::ScalarType compute_dtype(const SsdInputs& in) {
  return in.x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// The inputs as the scan computes with them: [B, H, S, .] fp32, B and C repeated over their
// groups' heads, x already times dt (the discretised input), a = dt A the log decay.
struct SsdHeads {
  torch::Tensor xdt, x, a, B, C;
};
SsdHeads head_major(const SsdInputs& in) {
  const int64_t H = in.x.size(2), G = in.B.size(2);
  const auto dtype = compute_dtype(in);
  const auto f32 = [dtype](const torch::Tensor& t) {
    return t.transpose(1, 2).to(dtype).contiguous();
  };
  auto B = in.B, C = in.C;
  if (G != H) {
    B = B.repeat_interleave(H / G, 2);
    C = C.repeat_interleave(H / G, 2);
  }
  SsdHeads h;
  h.x = f32(in.x);
  const auto dt = f32(in.dt);  // [B, H, S]
  h.xdt = h.x * dt.unsqueeze(-1);
  h.a = dt * in.A.to(dtype).view({1, -1, 1});
  h.B = f32(B);
  h.C = f32(C);
  return h;
}

// y + D x, back to [B, S, H, P].
torch::Tensor with_skip(const torch::Tensor& y, const SsdHeads& h, const torch::Tensor& D) {
  const auto out = y + h.x * D.to(y.scalar_type()).view({1, -1, 1, 1});
  return out.transpose(1, 2).contiguous();
}

}  // namespace

SsdOutput chunk_ssd_scan(const SsdInputs& in, int64_t Q) {
  const int64_t Bn = in.x.size(0), S = in.x.size(1), H = in.x.size(2), P = in.x.size(3);
  const int64_t N = in.B.size(3);
  const auto h = head_major(in);
  const int64_t pad = (Q - S % Q) % Q, NC = (S + pad) / Q;
  // Zero padding changes nothing before it: dt = 0 adds nothing and keeps the state.
  const auto xdt = F::pad(h.xdt, F::PadFuncOptions({0, 0, 0, pad})).view({Bn, H, NC, Q, P});
  const auto Bc = F::pad(h.B, F::PadFuncOptions({0, 0, 0, pad})).view({Bn, H, NC, Q, N});
  const auto Cc = F::pad(h.C, F::PadFuncOptions({0, 0, 0, pad})).view({Bn, H, NC, Q, N});
  const auto cum = F::pad(h.a, F::PadFuncOptions({0, pad})).view({Bn, H, NC, Q}).cumsum(-1);
  // The padding belongs to the last document, so the final state is the last token's.
  auto docs = document_ids(in.positions, Bn, S, in.x.device());
  if (pad > 0) docs = torch::cat({docs, docs.narrow(1, S - 1, 1).expand({Bn, pad})}, 1);
  docs = docs.view({Bn, 1, NC, Q});

  // Token j reaches token i (j <= i) through exp(cum_i - cum_j) unless a document starts
  // between them; the state from before the chunk reaches i through exp(cum_i) unless one
  // starts up to i; token j reaches the chunk's end state through exp(cum_last - cum_j) likewise.
  const auto causal = torch::ones({Q, Q}, docs.options().dtype(torch::kBool)).tril();
  const auto keep = docs.unsqueeze(-1).eq(docs.unsqueeze(-2)) & causal;  // [B, 1, NC, Q, Q]
  const auto before = torch::cat(
      {docs.narrow(2, 0, 1).narrow(3, 0, 1), docs.narrow(2, 0, NC - 1).narrow(3, Q - 1, 1)}, 2);
  const auto carried = docs.eq(before);                         // [B, 1, NC, Q]
  const auto reaches_last = docs.eq(docs.narrow(3, Q - 1, 1));  // [B, 1, NC, Q]
  const auto pair_decay =
      (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(keep.logical_not(), -kSsdInfinity).exp();
  const auto from_state =
      cum.masked_fill(carried.logical_not(), -kSsdInfinity).exp();  // [B, H, NC, Q]
  const auto cum_last = cum.narrow(3, Q - 1, 1);
  const auto to_last =
      (cum_last - cum).masked_fill(reaches_last.logical_not(), -kSsdInfinity).exp();
  const auto chunk_decay =
      cum_last.squeeze(-1)
          .masked_fill(carried.narrow(3, Q - 1, 1).squeeze(-1).logical_not(), -kSsdInfinity)
          .exp();  // [B, H, NC]

  // Within the chunk: (C B^T, decayed and masked) x dt; its contribution to the end state.
  const auto intra = torch::matmul(torch::matmul(Cc, Bc.transpose(-1, -2)) * pair_decay, xdt);
  const auto chunk_states =
      torch::matmul((xdt * to_last.unsqueeze(-1)).transpose(-1, -2), Bc);  // [B, H, NC, P, N]
  const auto c_decayed = Cc * from_state.unsqueeze(-1);

  auto state = torch::zeros({Bn, H, P, N}, xdt.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(NC));
  for (int64_t n = 0; n < NC; ++n) {
    outs.push_back(intra.select(2, n) +
                   torch::matmul(c_decayed.select(2, n), state.transpose(-1, -2)));
    state =
        state * chunk_decay.select(2, n).unsqueeze(-1).unsqueeze(-1) + chunk_states.select(2, n);
  }
  const auto y = torch::stack(outs, 2).view({Bn, H, NC * Q, P}).narrow(2, 0, S);
  return {with_skip(y, h, in.D), state};
}

SsdOutput recurrent_ssd_scan(const SsdInputs& in, const torch::Tensor& initial_state) {
  const int64_t Bn = in.x.size(0), S = in.x.size(1), H = in.x.size(2), P = in.x.size(3);
  const int64_t N = in.B.size(3);
  const auto h = head_major(in);
  auto state = initial_state.defined() ? initial_state.to(h.x.scalar_type())
                                       : torch::zeros({Bn, H, P, N}, h.x.options());
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t) {
    if (in.positions.defined()) {  // a document starts: nothing before it is remembered
      const auto keep = in.positions.select(1, t).ne(0).to(state.scalar_type());
      state = state * keep.view({Bn, 1, 1, 1});
    }
    state = state * h.a.select(2, t).exp().unsqueeze(-1).unsqueeze(-1) +
            h.xdt.select(2, t).unsqueeze(-1) * h.B.select(2, t).unsqueeze(-2);
    outs.push_back(torch::matmul(state, h.C.select(2, t).unsqueeze(-1)).squeeze(-1));
  }
  return {with_skip(torch::stack(outs, 2), h, in.D), state};
}

}  // namespace moe::model
