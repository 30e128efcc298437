// A frozen base matrix held in bitsandbytes' 4-bit format (quantization.load_in_4bit, QLoRA):
// our parameter's values live here as one quant::Quantized4bit per [out, in] matrix that
// bitsandbytes would quantize (q, k and v of the fused qkv projection separately; each expert's
// gate, up and down matrix of a stacked [E, in, out] parameter), and the parameter itself is
// emptied. The GEMMs dequantize right before they run and again in the backward, so no
// dequantized copy is kept for the backward (what bitsandbytes' MatMul4Bit does).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "moe/config/config.h"
#include "moe/layers/offload_ring.h"
#include "moe/quant/bnb_4bit.h"

namespace moe::layers {

struct Quant4bitOptions {
  config::Quant4bitType type = config::Quant4bitType::kNf4;
  bool double_quant = false;
  torch::ScalarType compute = torch::kFloat;  // bnb_4bit_compute_dtype
  bool fused = false;  // dequantize with our CUDA kernel on CUDA (moe.kernels not `reference`)
  // quantization.quant_method mxfp4: expert stacks held in MXFP4 (quant/mxfp4.h), dequantized
  // by the ATen reference on every device (no kernel of ours yet).
  bool mxfp4 = false;
  // quantization.dequant_scratch_mib: the most bytes of an expert stack dequantized for one
  // grouped GEMM; 0 = the whole stack.
  int64_t dequant_scratch_bytes = 0;
};
Quant4bitOptions quant_4bit_options(const config::Config& cfg, const torch::Device& device);

class QuantizedWeight {
 public:
  // A linear weight [out, in] (nn.Linear's layout) whose rows are `row_parts` matrices stacked
  // (one part: the whole weight).
  static std::shared_ptr<QuantizedWeight> linear(const torch::Tensor& w,
                                                 std::vector<int64_t> row_parts,
                                                 const Quant4bitOptions& opt);
  // A stack of expert matrices in our layout [E, in, out]: each expert's [out, in] matrix
  // (its transpose) is what bitsandbytes quantizes.
  static std::shared_ptr<QuantizedWeight> experts(const torch::Tensor& w,
                                                  const Quant4bitOptions& opt);

  // New values, same layout (loading weights): `w` has our parameter's shape.
  void requantize(const torch::Tensor& w);
  // Part `i` (an expert, or a row block of a linear weight) replaced by a state quantized
  // elsewhere (a bitsandbytes checkpoint's), of the same [out, in] shape.
  void replace_part(int64_t i, quant::Quantized4bit q);
  // MXFP4 experts: every expert's codes replaced by an MXFP4 checkpoint's, blocks [E, out, G,
  // 16] and scales [E, out, G] (the [out, in] matrices' layout).
  void replace_mxfp4(const torch::Tensor& blocks, const torch::Tensor& scales);
  bool is_mxfp4() const { return mx_blocks_.defined(); }
  const torch::Tensor& mxfp4_blocks() const { return mx_blocks_; }
  const torch::Tensor& mxfp4_scales() const { return mx_scales_; }
  // The part of a linear weight whose rows start at `row`.
  int64_t part_of_row(int64_t row) const;
  // Our parameter's values in `dtype` (default: the compute dtype), our layout.
  torch::Tensor dequantize(torch::ScalarType dtype = c10::ScalarType::Undefined) const;
  // The [out, in] matrices in `dtype`: [out, in] for a linear weight, [E, out, in] for experts.
  torch::Tensor dequantize_matrices(torch::ScalarType dtype) const;
  // Expert e's [out, in] matrix.
  torch::Tensor dequantize_expert(int64_t e, torch::ScalarType dtype) const;
  // Experts [first, first + count) as [count, out, in].
  torch::Tensor dequantize_experts(int64_t first, int64_t count, torch::ScalarType dtype) const;

  // Moves the state (not an offloaded one: that stays in host memory).
  void to(const torch::Device& device);
  // The expert offload tier (layers/offload_ring.h): the state's tensors (state_tensors(), from
  // `place.first` in the layer's list) live in the ring's host buffer, and the dequantize_*
  // calls a GEMM makes read the ring's device copy; dequantize() reads the host state.
  void offload(layers::OffloadedPlace place) { place_ = std::move(place); }
  bool offloaded() const { return static_cast<bool>(place_); }
  // Pointers to every tensor of the state in a fixed order: per part its codes, absmax,
  // nested_absmax and offset (the last two undefined without double quant); MXFP4: the blocks
  // and the scales.
  std::vector<torch::Tensor*> state_tensors();
  const std::vector<int64_t>& shape() const { return shape_; }  // our parameter's
  bool is_experts() const { return experts_; }
  const Quant4bitOptions& options() const { return opt_; }
  const std::vector<quant::Quantized4bit>& parts() const { return parts_; }
  int64_t bytes() const;

 private:
  QuantizedWeight(std::vector<int64_t> shape, bool experts, const Quant4bitOptions& opt)
      : shape_(std::move(shape)), experts_(experts), opt_(opt) {}
  std::vector<int64_t> shape_;
  bool experts_ = false;
  std::vector<int64_t> row_parts_;  // linear: rows per part
  Quant4bitOptions opt_;
  std::vector<quant::Quantized4bit> parts_;
  torch::Tensor mx_blocks_, mx_scales_;  // MXFP4 experts (opt_.mxfp4) instead of parts_
  layers::OffloadedPlace place_;         // offloaded: where the state sits in its ring
  // The state a GEMM reads: itself, or (offloaded) a copy over the ring's device tensors.
  QuantizedWeight resident() const;
  // Expert e's part as resident() would hold it, without copying the others.
  quant::Quantized4bit resident_part(int64_t e) const;
};
using QuantizedWeightPtr = std::shared_ptr<QuantizedWeight>;

// x [..., in] -> x W^T [..., out] as bitsandbytes' Linear4bit computes it: x and W in the
// compute dtype, the result in x's dtype. Gradients reach x only (the base is frozen).
torch::Tensor linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w);
// The same plus a 16-bit `bias` [out] (undefined: none), added in the result's dtype.
torch::Tensor linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w,
                          const torch::Tensor& bias);
// Expert e's projection of rows `x` [n, in] -> [n, out].
torch::Tensor expert_linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w, int64_t e);
// Expert-ordered bf16 rows with group ends `offs` through every expert's matrix
// (at::_grouped_mm over the stack dequantized to bf16: whole, or a few experts at a time where
// the options' dequant_scratch_bytes is smaller than the stack).
torch::Tensor grouped_linear_4bit(const torch::Tensor& x_bf16, const QuantizedWeightPtr& w,
                                  const torch::Tensor& offs);

}  // namespace moe::layers
