#include "moe/layers/frozen_4bit.h"

#include <algorithm>

#include <ATen/autocast_mode.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include "moe/kernels/dequant_4bit.h"
#include "moe/kernels/dequant_mxfp4.h"
#include "moe/quant/mxfp4.h"

namespace moe::layers {

namespace {

torch::ScalarType compute_dtype(config::QuantComputeDtype d) {
  switch (d) {
    case config::QuantComputeDtype::kBfloat16:
      return torch::kBFloat16;
    case config::QuantComputeDtype::kFloat16:
      return torch::kHalf;
    case config::QuantComputeDtype::kFloat32:
      break;
  }
  return torch::kFloat;
}

// The weight a graph node dequantizes again in its backward: held by the node, so the 4-bit
// state outlives the graph even if the module goes first.
struct HeldWeight : torch::CustomClassHolder {
  QuantizedWeightPtr w;
};
c10::IValue hold(const QuantizedWeightPtr& w) {
  auto h = c10::make_intrusive<HeldWeight>();
  h->w = w;
  return c10::IValue::make_capsule(std::move(h));
}
QuantizedWeightPtr held(const c10::IValue& v) {
  return c10::static_intrusive_pointer_cast<HeldWeight>(v.toCapsule())->w;
}

// x W^T with W dequantized in the forward and again in the backward (bitsandbytes'
// MatMul4Bit): only the 4-bit state is kept for the backward, not W, not x (W is frozen).
class Linear4bitFn : public torch::autograd::Function<Linear4bitFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const QuantizedWeightPtr& w, int64_t expert) {
    // The compute dtype is the config's (bnb_4bit_compute_dtype), not autocast's.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto compute = w->options().compute;
    ctx->saved_data["w"] = hold(w);
    ctx->saved_data["expert"] = expert;
    ctx->saved_data["dtype"] = x.scalar_type();
    const auto W = matrix(*w, expert, compute);
    return at::matmul(x.to(compute), W.t()).to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto w = held(ctx->saved_data["w"]);
    const auto compute = w->options().compute;
    const auto W = matrix(*w, ctx->saved_data["expert"].toInt(), compute);
    const auto gx = at::matmul(grads[0].to(compute), W).to(ctx->saved_data["dtype"].toScalarType());
    return {gx, torch::Tensor(), torch::Tensor()};
  }

 private:
  static torch::Tensor matrix(const QuantizedWeight& w, int64_t expert, torch::ScalarType dt) {
    return expert < 0 ? w.dequantize_matrices(dt) : w.dequantize_expert(expert, dt);
  }
};

// Rows x (expert-ordered, group ends offs) through each expert's matrix dequantized to bf16:
// x W^T forward, x W backward. The whole stack in one grouped GEMM, or, where it is larger than
// the options' dequant_scratch_bytes, a few experts at a time: their rows found from the group
// ends read on the host (the one sync), each slice's GEMM on its own rows.
torch::Tensor grouped_4bit(const torch::Tensor& x, const QuantizedWeight& w,
                           const torch::Tensor& offs, bool transposed) {
  const auto& shape = w.shape();  // [E, in, out]
  const int64_t E = shape[0], per_expert = shape[1] * shape[2] * 2;
  const int64_t budget = w.options().dequant_scratch_bytes;
  const int64_t chunk = budget > 0 ? std::clamp<int64_t>(budget / per_expert, 1, E) : E;
  auto orient = [&](const torch::Tensor& W) { return transposed ? W.transpose(1, 2) : W; };
  if (chunk == E) return at::_grouped_mm(x, orient(w.dequantize_matrices(torch::kBFloat16)), offs);
  const auto ends_tensor = offs.to(torch::kCPU, torch::kLong);
  const int64_t* ends = ends_tensor.data_ptr<int64_t>();
  const int64_t out_width = transposed ? shape[2] : shape[1];
  std::vector<torch::Tensor> pieces;
  for (int64_t first = 0; first < E; first += chunk) {
    const int64_t n = std::min(chunk, E - first);
    const int64_t begin = first == 0 ? 0 : ends[first - 1], end = ends[first + n - 1];
    if (end == begin) continue;  // no rows for these experts: nothing to dequantize
    const auto local_ends = (offs.narrow(0, first, n) - static_cast<int32_t>(begin)).contiguous();
    pieces.push_back(at::_grouped_mm(x.narrow(0, begin, end - begin),
                                     orient(w.dequantize_experts(first, n, torch::kBFloat16)),
                                     local_ends));
  }
  // Rows past the last group end (none in practice) are zero, not left unwritten.
  const int64_t tail = x.size(0) - ends[E - 1];
  if (tail > 0) pieces.push_back(torch::zeros({tail, out_width}, x.options()));
  if (pieces.empty()) return torch::zeros({x.size(0), out_width}, x.options());
  return pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 0);
}

// The grouped-GEMM form over an expert stack, dequantized to bf16 in each direction.
class Grouped4bitFn : public torch::autograd::Function<Grouped4bitFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const QuantizedWeightPtr& w, const torch::Tensor& offs) {
    ctx->saved_data["w"] = hold(w);
    ctx->save_for_backward({offs});
    return grouped_4bit(x, *w, offs, /*transposed=*/true);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto w = held(ctx->saved_data["w"]);
    const auto offs = ctx->get_saved_variables()[0];
    return {grouped_4bit(grads[0].to(torch::kBFloat16), *w, offs, /*transposed=*/false),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

Quant4bitOptions quant_4bit_options(const config::Config& cfg, const torch::Device& device) {
  Quant4bitOptions o;
  o.type = cfg.quantization.bnb_4bit_quant_type;
  o.double_quant = cfg.quantization.bnb_4bit_use_double_quant;
  o.compute = compute_dtype(cfg.quantization.bnb_4bit_compute_dtype);
  o.fused = device.is_cuda() && cfg.moe.kernels != config::MoeKernels::kReference;
  o.mxfp4 = cfg.quantization.quant_method == config::QuantMethod::kMxfp4;
  o.dequant_scratch_bytes = cfg.quantization.dequant_scratch_mib * (int64_t{1} << 20);
  return o;
}

std::shared_ptr<QuantizedWeight> QuantizedWeight::linear(const torch::Tensor& w,
                                                         std::vector<int64_t> row_parts,
                                                         const Quant4bitOptions& opt) {
  TORCH_CHECK(w.dim() == 2, "a 4-bit linear weight is [out, in]");
  if (row_parts.empty()) row_parts = {w.size(0)};
  std::shared_ptr<QuantizedWeight> q(new QuantizedWeight(w.sizes().vec(), false, opt));
  q->row_parts_ = std::move(row_parts);
  q->requantize(w);
  return q;
}

std::shared_ptr<QuantizedWeight> QuantizedWeight::experts(const torch::Tensor& w,
                                                          const Quant4bitOptions& opt) {
  TORCH_CHECK(w.dim() == 3, "a 4-bit expert stack is [E, in, out]");
  std::shared_ptr<QuantizedWeight> q(new QuantizedWeight(w.sizes().vec(), true, opt));
  q->requantize(w);
  return q;
}

void QuantizedWeight::requantize(const torch::Tensor& w) {
  TORCH_CHECK(w.sizes().vec() == shape_, "requantize: shape ", w.sizes(), " is not ", shape_);
  if (opt_.mxfp4) {
    TORCH_CHECK(experts_, "MXFP4 holds expert stacks only");
    const auto device = mx_blocks_.defined() ? mx_blocks_.device() : w.device();
    auto [blocks, scales] = quant::quantize_mxfp4(w.transpose(1, 2));  // [E, out, in]
    mx_blocks_ = blocks.to(device);
    mx_scales_ = scales.to(device);
    return;
  }
  const auto device = parts_.empty() ? w.device() : parts_.front().codes.device();
  std::vector<quant::Quantized4bit> parts;
  auto add = [&](const torch::Tensor& m) {
    parts.push_back(quant::quantize_4bit(m, opt_.type, opt_.double_quant).to(device));
  };
  if (experts_) {
    for (int64_t e = 0; e < shape_[0]; ++e) add(w[e].t());  // bitsandbytes' [out, in]
  } else {
    int64_t row = 0;
    for (const int64_t rows : row_parts_) {
      add(w.narrow(0, row, rows));
      row += rows;
    }
  }
  parts_ = std::move(parts);
}

void QuantizedWeight::replace_part(int64_t i, quant::Quantized4bit q) {
  auto& part = parts_.at(static_cast<size_t>(i));
  TORCH_CHECK(q.shape == part.shape, "replace_part: shape ", q.shape, " is not ", part.shape);
  part = q.to(part.codes.device());
}

void QuantizedWeight::replace_mxfp4(const torch::Tensor& blocks, const torch::Tensor& scales) {
  TORCH_CHECK(
      is_mxfp4() && blocks.sizes() == mx_blocks_.sizes() && scales.sizes() == mx_scales_.sizes(),
      "replace_mxfp4: blocks ", blocks.sizes(), " / scales ", scales.sizes(), " are not ",
      mx_blocks_.sizes(), " / ", mx_scales_.sizes());
  mx_blocks_ = blocks.contiguous().to(mx_blocks_.device());
  mx_scales_ = scales.contiguous().to(mx_scales_.device());
}

int64_t QuantizedWeight::part_of_row(int64_t row) const {
  int64_t begin = 0;
  for (size_t i = 0; i < row_parts_.size(); ++i) {
    if (begin == row) return static_cast<int64_t>(i);
    begin += row_parts_[i];
  }
  TORCH_CHECK(false, "part_of_row: no part starts at row ", row);
}

std::vector<torch::Tensor*> QuantizedWeight::state_tensors() {
  if (is_mxfp4()) return {&mx_blocks_, &mx_scales_};
  std::vector<torch::Tensor*> t;
  for (auto& p : parts_) {
    for (torch::Tensor* x : {&p.codes, &p.absmax, &p.nested_absmax, &p.offset}) t.push_back(x);
  }
  return t;
}

QuantizedWeight QuantizedWeight::resident() const {
  QuantizedWeight r = *this;
  r.place_ = {};
  if (!place_) return r;
  const auto& fetched = place_.fetch();
  auto tensors = r.state_tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    *tensors[i] = fetched.at(static_cast<size_t>(place_.first) + i);
  }
  return r;
}

quant::Quantized4bit QuantizedWeight::resident_part(int64_t e) const {
  quant::Quantized4bit p = parts_.at(static_cast<size_t>(e));
  if (!place_) return p;
  const auto& t = place_.fetch();
  const size_t i = static_cast<size_t>(place_.first + 4 * e);  // state_tensors(): 4 per part
  p.codes = t.at(i);
  p.absmax = t.at(i + 1);
  p.nested_absmax = t.at(i + 2);
  p.offset = t.at(i + 3);
  return p;
}

torch::Tensor QuantizedWeight::dequantize_matrices(torch::ScalarType dtype) const {
  if (place_) return resident().dequantize_matrices(dtype);
  if (is_mxfp4()) {  // [E, out, G * 32] = [E, out, in]
    auto m = torch::empty({shape_[0], shape_[2], shape_[1]}, mx_blocks_.options().dtype(dtype));
    kernels::dequantize_mxfp4_into(mx_blocks_, mx_scales_, m, opt_.fused);
    return m;
  }
  if (experts_) return dequantize_experts(0, shape_[0], dtype);
  const auto options = parts_.front().codes.options().dtype(dtype);
  auto m = torch::empty(shape_, options);
  int64_t row = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    kernels::dequantize_4bit_into(parts_[i], m.narrow(0, row, row_parts_[i]), opt_.fused);
    row += row_parts_[i];
  }
  return m;
}

torch::Tensor QuantizedWeight::dequantize_experts(int64_t first, int64_t count,
                                                  torch::ScalarType dtype) const {
  TORCH_CHECK(experts_ && first >= 0 && count >= 0 && first + count <= shape_[0],
              "dequantize_experts: experts [", first, ", ", first + count, ") of ", shape_);
  if (place_) return resident().dequantize_experts(first, count, dtype);
  const int64_t in = shape_[1], out = shape_[2];
  if (is_mxfp4()) {
    auto m = torch::empty({count, out, in}, mx_blocks_.options().dtype(dtype));
    kernels::dequantize_mxfp4_into(mx_blocks_.narrow(0, first, count),
                                   mx_scales_.narrow(0, first, count), m, opt_.fused);
    return m;
  }
  auto m = torch::empty({count, out, in}, parts_.front().codes.options().dtype(dtype));
  for (int64_t e = 0; e < count; ++e) {
    kernels::dequantize_4bit_into(parts_[static_cast<size_t>(first + e)], m[e], opt_.fused);
  }
  return m;
}

torch::Tensor QuantizedWeight::dequantize_expert(int64_t e, torch::ScalarType dtype) const {
  if (is_mxfp4()) {
    if (place_) return resident().dequantize_expert(e, dtype);
    auto m = torch::empty({shape_[2], shape_[1]}, mx_blocks_.options().dtype(dtype));
    kernels::dequantize_mxfp4_into(mx_blocks_[e], mx_scales_[e], m, opt_.fused);
    return m;
  }
  const auto p = resident_part(e);
  auto m = torch::empty(p.shape, p.codes.options().dtype(dtype));
  kernels::dequantize_4bit_into(p, m, opt_.fused);
  return m;
}

torch::Tensor QuantizedWeight::dequantize(torch::ScalarType dtype) const {
  if (place_) {  // the host state (export, merge): no device copy of the whole base
    QuantizedWeight host = *this;
    host.place_ = {};
    return host.dequantize(dtype);
  }
  const auto m = dequantize_matrices(dtype == c10::ScalarType::Undefined ? opt_.compute : dtype);
  return experts_ ? m.transpose(1, 2) : m;
}

void QuantizedWeight::to(const torch::Device& device) {
  if (place_) return;  // offloaded: the host state is the ring's
  for (auto& p : parts_) p = p.to(device);
  if (is_mxfp4()) mx_blocks_ = mx_blocks_.to(device), mx_scales_ = mx_scales_.to(device);
}

int64_t QuantizedWeight::bytes() const {
  int64_t b = is_mxfp4() ? mx_blocks_.nbytes() + mx_scales_.nbytes() : 0;
  for (const auto& p : parts_) b += p.bytes();
  return b;
}

torch::Tensor linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w) {
  return Linear4bitFn::apply(x, w, int64_t{-1});
}

torch::Tensor linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w,
                          const torch::Tensor& bias) {
  const auto y = linear_4bit(x, w);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

torch::Tensor expert_linear_4bit(const torch::Tensor& x, const QuantizedWeightPtr& w, int64_t e) {
  return Linear4bitFn::apply(x, w, e);
}

torch::Tensor grouped_linear_4bit(const torch::Tensor& x_bf16, const QuantizedWeightPtr& w,
                                  const torch::Tensor& offs) {
  return Grouped4bitFn::apply(x_bf16, w, offs);
}

}  // namespace moe::layers
