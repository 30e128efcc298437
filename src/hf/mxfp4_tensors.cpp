#include "moe/hf/mxfp4_tensors.h"

#include <cstring>

#include <torch/torch.h>

#include "moe/quant/mxfp4.h"
#include "moe/util/errors.h"

namespace moe::hf {

namespace {

struct Halves {
  const HfTensorRef *blocks, *scales;
};

// Both halves, checked against each other (no data read).
Halves halves(const HfWeights& w, const std::string& name) {
  const HfTensorRef* b = w.find(name + "_blocks");
  const HfTensorRef* s = w.find(name + "_scales");
  const HfTensorRef* any = b != nullptr ? b : s;
  const std::string where = "hf: " + any->file->path() + ": tensor '" + name;
  if (b == nullptr || s == nullptr) {
    throw UserError(where + (b == nullptr ? "_blocks" : "_scales") +
                    "' is missing (an MXFP4 tensor has both _blocks and _scales)");
  }
  const auto& be = *b->entry;
  const auto& se = *s->entry;
  if (be.dtype != "U8" || se.dtype != "U8") {
    throw UserError(where + "_blocks/_scales' are " + be.dtype + "/" + se.dtype +
                    "; MXFP4 blocks and scales are U8");
  }
  const bool layout = be.shape.size() == 4 && be.shape[3] == quant::kMxfp4BlockBytes &&
                      se.shape == std::vector<int64_t>(be.shape.begin(), be.shape.end() - 1);
  if (!layout) {
    throw UserError(where + "_blocks' " + shape_text(be.shape) + " and '" + name + "_scales' " +
                    shape_text(se.shape) +
                    ": MXFP4 expert stacks are [E, rows, G, 16] blocks with [E, rows, G] scales");
  }
  return {b, s};
}

torch::Tensor read_u8(const HfTensorRef& ref) {
  const auto& e = *ref.entry;
  auto t = torch::empty(e.shape, torch::kUInt8);
  std::memcpy(t.data_ptr(), ref.file->data(e), e.end - e.begin);
  ref.file->release(e);
  return t;
}

}  // namespace

std::optional<std::vector<int64_t>> mxfp4_shape(const HfWeights& w, const std::string& name) {
  if (w.find(name + "_blocks") == nullptr && w.find(name + "_scales") == nullptr) {
    return std::nullopt;
  }
  const auto& s = halves(w, name).blocks->entry->shape;
  return std::vector<int64_t>{s[0], s[2] * 2 * quant::kMxfp4BlockBytes, s[1]};
}

std::pair<torch::Tensor, torch::Tensor> read_mxfp4_codes(const HfWeights& w,
                                                         const std::string& name) {
  const Halves h = halves(w, name);
  return {read_u8(*h.blocks), read_u8(*h.scales)};
}

torch::Tensor read_mxfp4(const HfWeights& w, const std::string& name, torch::ScalarType dtype) {
  const Halves h = halves(w, name);
  const auto values = quant::dequantize_mxfp4(read_u8(*h.blocks), read_u8(*h.scales), dtype);
  // [E, rows, G, 32] -> [E, rows, G * 32] -> the parameter's [E, G * 32, rows].
  const auto& s = h.blocks->entry->shape;
  return values.reshape({s[0], s[1], -1}).transpose(1, 2).contiguous();
}

bool is_mxfp4_part(const HfWeights& w, const std::string& name) {
  for (const std::string suffix : {"_blocks", "_scales"}) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string base = name.substr(0, name.size() - suffix.size());
      return w.find(base + "_blocks") != nullptr && w.find(base + "_scales") != nullptr;
    }
  }
  return false;
}

}  // namespace moe::hf
