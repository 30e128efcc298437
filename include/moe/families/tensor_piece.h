// One entry of the table between our parameter names and a Hugging Face family's tensor names:
// which part of one of our parameters an HF tensor is (one expert of a stacked [E, ...] weight,
// a row range of the fused q/k/v projection, transposed or not). Plain data: families declare
// their tensors with it, hf/hf_tensor_map.h reads and writes through it.
#pragma once

#include <cstdint>
#include <string>

namespace moe::families {

struct TensorPiece {
  std::string hf;         // "model.layers.0.self_attn.q_proj.weight"
  std::string ours;       // "blocks.0.attn.qkv.weight"
  int64_t expert = -1;    // >= 0: the expert's slice of a stacked [E, ...] weight
  int64_t row_begin = 0;  // rows [row_begin, row_begin + rows) of ours (rows < 0: all)
  int64_t rows = -1;
  bool transpose = false;  // ours holds the transpose (our experts are [d, f], HF's [f, d])
  // step > 1: ours is every step-th element of the HF tensor's last dimension from `first`
  // (gpt-oss's gate_up_proj interleaves gate and up columns); several pieces share the tensor.
  int64_t hf_first = 0, hf_step = 1;
  // hf_rows >= 0: ours is rows [hf_row_begin, hf_row_begin + hf_rows) of the HF tensor's
  // second-to-last dimension, which has hf_rows_total (a released fused expert stack:
  // gate_up_proj [E, 2f, d], gate rows first); several pieces share the tensor.
  int64_t hf_row_begin = 0, hf_rows = -1, hf_rows_total = 0;
  // The HF tensor has a leading dimension of 1 that ours lacks (ERNIE 4.5's [1, E] correction
  // bias, one row per expert group).
  bool hf_leading_one = false;
};

}  // namespace moe::families
