// The selective state-space scan of Mamba-2 (Dao & Gu 2024, "state space duality"; Nemotron-H,
// Granite 4.0-H), the ATen reference: per head an fp32 state S [P, N] that decays by
// exp(dt_t A) and takes in dt_t x_t B_t^T; the output reads it through C_t plus the D skip:
//   S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T;   y_t = S_t C_t + D x_t
// Two forms of the same arithmetic: the chunked one (within a chunk the masked "attention"
// (C B^T) * decay over dt x, between chunks one state per chunk; what training runs, as
// transformers' torch path and mamba-ssm's chunk kernels) and the recurrent one (a token at a
// time; the second oracle, and generation's step).
// Packed documents: `positions` [B, S] restarting at 0 where a document starts resets the state
// there, so a packed window equals its documents run alone.
#pragma once

#include <torch/types.h>

namespace moe::model {

struct SsdInputs {
  torch::Tensor x;          // [B, S, H, P] (any float dtype; computed in fp32, fp64 if x is)
  torch::Tensor dt;         // [B, S, H] fp32: the time step after softplus and its limits
  torch::Tensor A;          // [H] fp32, negative (-exp(A_log))
  torch::Tensor B, C;       // [B, S, G, N], G dividing H (head h reads group h / (H / G))
  torch::Tensor D;          // [H]: the skip
  torch::Tensor positions;  // [B, S] int64, restarting at 0 per document; undefined: one sequence
};

struct SsdOutput {
  torch::Tensor y;            // [B, S, H, P] fp32 (fp64 for fp64 x)
  torch::Tensor final_state;  // [B, H, P, N] likewise: the state after the last token
};

// Chunks of `chunk` tokens (the last one zero-padded).
SsdOutput chunk_ssd_scan(const SsdInputs& in, int64_t chunk);
// A token at a time, from `initial_state` [B, H, P, N] (undefined: zeros).
SsdOutput recurrent_ssd_scan(const SsdInputs& in, const torch::Tensor& initial_state = {});

}  // namespace moe::model
