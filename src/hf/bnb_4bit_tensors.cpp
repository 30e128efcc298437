#include "moe/hf/bnb_4bit_tensors.h"

#include <array>
#include <cstring>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "moe/util/errors.h"
#include "moe/util/safetensors_dtype.h"

namespace moe::hf {

namespace {

constexpr std::array<const char*, 2> kStateSuffixes = {".quant_state.bitsandbytes__nf4",
                                                       ".quant_state.bitsandbytes__fp4"};
constexpr std::array<const char*, 5> kCompanions = {".absmax", ".quant_map", ".nested_absmax",
                                                    ".nested_quant_map", ".quant_state."};

// The tensor as stored (a copy: safetensors offsets need not be aligned for the element type).
torch::Tensor read(const HfTensorRef& ref, const std::string& where) {
  const auto& e = *ref.entry;
  const auto dtype = scalar_type_of_safetensors(e.dtype);
  if (!dtype) throw UserError(where + " has dtype " + e.dtype + "; bitsandbytes writes U8/F32");
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(*dtype));
  std::memcpy(t.data_ptr(), ref.file->data(e), e.end - e.begin);
  return t;
}

}  // namespace

bool is_bnb_4bit_companion(const HfWeights& w, const std::string& name) {
  for (const char* suffix : kCompanions) {
    const auto at = name.rfind(suffix);
    if (at == std::string::npos || at == 0) continue;
    const std::string weight = name.substr(0, at);
    for (const char* s : kStateSuffixes) {
      if (w.find(weight + s) != nullptr) return true;
    }
  }
  return false;
}

namespace {

// One weight's companions, read by suffix; a missing one is an error naming it.
struct Companions {
  const HfWeights& w;
  const std::string& name;
  const std::string& where;
  torch::Tensor need(const std::string& suffix) const {
    const HfTensorRef* r = w.find(name + suffix);
    if (r == nullptr) {
      throw UserError(where + ": a bitsandbytes 4-bit weight without its '" + name + suffix + "'");
    }
    return read(*r, where + suffix);
  }
};

// Untrusted numbers: a shape of positive dimensions whose product cannot overflow, a block size
// bitsandbytes accepts (even, up to 4096), before any of them sizes an allocation.
void check_numbers(const quant::Quantized4bit& q, const nlohmann::json& j,
                   const std::string& where) {
  bool dims_ok = !q.shape.empty() && q.shape.size() <= 4;
  int64_t n = 1;
  for (const int64_t d : q.shape) {
    dims_ok = dims_ok && d > 0 && d <= (int64_t{1} << 40) / n;
    if (dims_ok) n *= d;
  }
  if (!dims_ok || q.blocksize < 2 || q.blocksize > 4096 || q.blocksize % 2 != 0) {
    throw UserError(where + ": quant_state shape " + j.at("shape").dump() + " / blocksize " +
                    std::to_string(q.blocksize) +
                    " is not a bitsandbytes 4-bit state (positive dimensions, at most 2^40 "
                    "values, an even blocksize up to 4096)");
  }
}

// Double quant: the nested absmax, the offset, and bitsandbytes' dynamic map as the code.
void read_nested(quant::Quantized4bit& q, const nlohmann::json& j, const Companions& c) {
  if (j.value("nested_blocksize", int64_t{0}) != quant::kNestedBlocksize) {
    throw UserError(c.where + ": nested_blocksize " +
                    (j.contains("nested_blocksize") ? j["nested_blocksize"].dump() : "missing") +
                    "; bitsandbytes' double quant uses 256");
  }
  q.nested_absmax = c.need(".nested_absmax").reshape(-1).to(torch::kFloat);
  q.offset = torch::tensor(static_cast<float>(j.at("nested_offset").get<double>()));
  if (!torch::equal(c.need(".nested_quant_map").to(torch::kFloat), quant::dynamic_map())) {
    throw UserError(c.where + ".nested_quant_map is not bitsandbytes' dynamic map");
  }
}

// The codes, absmax and nested absmax sized as the shape and blocksize imply.
void check_sizes(const quant::Quantized4bit& q, const nlohmann::json& j, const std::string& where) {
  const bool nested = q.double_quant();
  const bool sized =
      q.codes.numel() == (q.numel() + 1) / 2 && q.absmax.numel() == q.blocks() &&
      q.codes.scalar_type() == torch::kUInt8 &&
      q.absmax.scalar_type() == (nested ? torch::kUInt8 : torch::kFloat) &&
      (!nested || q.nested_absmax.numel() ==
                      (q.blocks() + quant::kNestedBlocksize - 1) / quant::kNestedBlocksize);
  if (!sized) {
    throw UserError(where + ": its codes, absmax and quant_state (shape " + j.at("shape").dump() +
                    ", blocksize " + std::to_string(q.blocksize) + ") do not agree");
  }
}

}  // namespace

std::optional<quant::Quantized4bit> read_bnb_4bit(const HfWeights& w, const std::string& name) {
  const HfTensorRef* state = nullptr;
  quant::Quant4bitType type = quant::Quant4bitType::kNf4;
  for (size_t i = 0; i < kStateSuffixes.size() && state == nullptr; ++i) {
    state = w.find(name + kStateSuffixes[i]);
    if (state != nullptr) type = i == 0 ? quant::Quant4bitType::kNf4 : quant::Quant4bitType::kFp4;
  }
  if (state == nullptr) return std::nullopt;
  const std::string where = "hf: " + state->file->path() + ": tensor '" + name + "'";
  const HfTensorRef* codes = w.find(name);
  if (codes == nullptr) throw UserError(where + ": a quant_state without its codes");
  const Companions c{w, name, where};
  const auto bytes = read(*state, where + " quant_state");
  try {
    const auto j = nlohmann::json::parse(std::string(
        reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())));
    quant::Quantized4bit q;
    q.type = type;
    q.shape = j.at("shape").get<std::vector<int64_t>>();
    q.blocksize = j.at("blocksize").get<int64_t>();
    check_numbers(q, j, where);
    q.codes = read(*codes, where).reshape(-1);
    q.absmax = c.need(".absmax").reshape(-1);
    if (j.contains("nested_offset")) read_nested(q, j, c);
    if (!torch::equal(c.need(".quant_map").to(torch::kFloat), quant::code_4bit(type))) {
      throw UserError(where + ".quant_map is not bitsandbytes' " +
                      j.at("quant_type").get<std::string>() + " code book");
    }
    check_sizes(q, j, where);
    return q;
  } catch (const nlohmann::json::exception& e) {
    throw UserError(where + ": quant_state is not bitsandbytes' JSON: " + e.what());
  }
}

}  // namespace moe::hf
