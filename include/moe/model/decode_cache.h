// What a model carries from one generation step to the next: per layer the attention's keys and
// values (a rolling window of them for sliding-window layers), or the Gated DeltaNet's conv and
// recurrent states; and per step where its tokens sit. A batch of prompts of different lengths
// is left-padded: slot t of row b holds a real token where `valid[b][t]`, and the rotary
// positions count real tokens only (as transformers' generate derives position_ids from the
// attention mask).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace moe::model {

// One layer's cache. Attention: k, v [B, KV, T, hd] after the rotation (latent attention: k the
// normalised latent and the rotated rotary key [B, 1, T, kvr + rope], v empty [B, 1, T, 0];
// model/latent_attention.cpp), slots [first_slot, first_slot + T). Gated DeltaNet: conv
// [B, K - 1, C] (the last inputs of its causal conv1d) and recurrent [B, Hv, dk, dv] fp32.
struct LayerCache {
  torch::Tensor k, v;
  int64_t first_slot = 0;
  torch::Tensor conv, recurrent;
};

// The step being run: S new tokens per row after `past` cached slots.
struct DecodeStep {
  torch::Tensor positions;  // [B, S] int64 rotary positions of the new tokens
  torch::Tensor valid;      // [B, past + S] bool: slots holding real tokens
  int64_t past = 0;
};

struct AttendedKeys {
  torch::Tensor k, v;  // [B, KV, T, hd]: the cached slots then this step's
  torch::Tensor mask;  // [B, 1, S, T] bool: true where a query may attend
};

// Appends this step's k, v [B, KV, S, hd] to `cache` and returns every slot a query of this
// step may see with its mask: causal, real tokens only, within `window` (> 0: the last `window`
// slots, itself included). A padding query sees itself, so that no row of the softmax is empty.
// With a window the cache then keeps only the last window - 1 slots (what the next step needs).
AttendedKeys attend_cached(LayerCache& cache, const DecodeStep& step, const torch::Tensor& k,
                           const torch::Tensor& v, int64_t window);

}  // namespace moe::model
