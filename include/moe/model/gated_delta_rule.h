// The gated delta rule of Gated DeltaNet (Yang et al. 2024; Qwen3-Next, Qwen3.5), the ATen
// reference: per value head an fp32 state S [dk, dv] that decays by exp(g_t), forgets what it
// predicts for k_t and stores v_t in its place at the rate beta_t:
//   S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T q_t dk^-0.5
// with q and k L2-normalised. Two forms of the same arithmetic: the chunked one (chunks of 64
// tokens, a unit-lower triangular solve per chunk, then one state update per chunk; what
// training runs, as transformers' torch_chunk_gated_delta_rule and flash-linear-attention's
// chunk kernels) and the recurrent one (a token at a time; the second oracle).
// Packed documents: `positions` [B, S] restarting at 0 where a document starts (attention's
// document layout) resets the state there, so a packed window equals its documents run alone.
#pragma once

#include <torch/types.h>

namespace moe::model {

struct DeltaRuleInputs {
  torch::Tensor q, k;  // [B, S, Hk, dk] (any float dtype; computed in fp32)
  torch::Tensor
      v;  // [B, S, Hv, dv], Hv a multiple of Hk (value head h reads key head h / (Hv / Hk))
  torch::Tensor g;          // [B, S, Hv] log decay (<= 0), fp32
  torch::Tensor beta;       // [B, S, Hv] in (0, 1)
  torch::Tensor positions;  // [B, S] int64, restarting at 0 per document; undefined: one sequence
};

struct DeltaRuleOutput {
  torch::Tensor o;            // [B, S, Hv, dv] in q's dtype
  torch::Tensor final_state;  // [B, Hv, dk, dv] fp32: the state after the last token
};

// Chunks of `chunk` tokens (64 as transformers and fla; the last one zero-padded).
DeltaRuleOutput chunk_gated_delta_rule(const DeltaRuleInputs& in, int64_t chunk = 64);
// A token at a time, from `initial_state` [B, Hv, dk, dv] (undefined: zeros).
DeltaRuleOutput recurrent_gated_delta_rule(const DeltaRuleInputs& in,
                                           const torch::Tensor& initial_state = {});

// x / sqrt(sum(x^2) + 1e-6) over the last dimension (fla's l2norm, transformers' copy of it).
torch::Tensor delta_rule_l2norm(const torch::Tensor& x);

// Causal depthwise convolution over time, x [B, S, C], weight [C, 1, K] (nn.Conv1d's layout,
// padding K - 1 on the left), plus `bias` [C] where defined (Mamba-2's), then SiLU. A token sees
// only the earlier tokens of its own document (`positions` as above; undefined: one sequence).
torch::Tensor causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                 const torch::Tensor& positions = {},
                                 const torch::Tensor& bias = {});

}  // namespace moe::model
