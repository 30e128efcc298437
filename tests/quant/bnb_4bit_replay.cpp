// Quantizes given tensors with our bitsandbytes 4-bit code, for tests/quant/bnb_4bit_test.py to
// compare with bitsandbytes itself (the oracle) on the same inputs.
//   bnb_4bit_replay IN.safetensors OUT.safetensors nf4|fp4 0|1
// IN: 2-D tensors are [out, in] matrices (quant::quantize_4bit); 3-D tensors named "experts.*"
// are our expert stacks [E, in, out] (layers::QuantizedWeight::experts: each expert's [out, in]
// matrix); any other shape is quantized flat. OUT per matrix NAME (experts: NAME.E per expert):
// NAME.codes, NAME.absmax, and under double quant NAME.nested_absmax, NAME.offset; NAME.fp32,
// NAME.bf16 (dequantized); for stacks NAME.stack.fp32 (our [E, in, out] layout).
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moe/config/choices.h"
#include "moe/layers/frozen_4bit.h"
#include "moe/quant/bnb_4bit.h"
#include "moe/util/safetensors.h"
#include "moe/util/safetensors_dtype.h"

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

void add_state(Named& out, const std::string& name, const moe::quant::Quantized4bit& q) {
  out.emplace_back(name + ".codes", q.codes);
  out.emplace_back(name + ".absmax", q.absmax);
  if (q.double_quant()) {
    out.emplace_back(name + ".nested_absmax", q.nested_absmax);
    out.emplace_back(name + ".offset", q.offset.reshape({1}));
  }
  out.emplace_back(name + ".fp32", moe::quant::dequantize_4bit(q, torch::kFloat));
  out.emplace_back(name + ".bf16", moe::quant::dequantize_4bit(q, torch::kBFloat16));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: bnb_4bit_replay IN OUT nf4|fp4 0|1\n");
    return 2;
  }
  const moe::SafetensorsFile in(argv[1]);
  moe::layers::Quant4bitOptions opt;
  opt.type = *moe::config::parse_choice<moe::config::Quant4bitType>(argv[3]);
  opt.double_quant = std::string(argv[4]) == "1";
  Named out;
  for (const auto& [name, e] : in.entries()) {
    const auto dtype = *moe::scalar_type_of_safetensors(e.dtype);
    auto t = torch::empty(e.shape, dtype);
    std::memcpy(t.data_ptr(), in.data(e), e.end - e.begin);
    if (t.dim() == 3 && name.rfind("experts.", 0) == 0) {
      const auto stack = moe::layers::QuantizedWeight::experts(t, opt);
      for (size_t i = 0; i < stack->parts().size(); ++i) {
        add_state(out, name + "." + std::to_string(i), stack->parts()[i]);
      }
      out.emplace_back(name + ".stack.fp32", stack->dequantize(torch::kFloat));
      continue;
    }
    add_state(out, name, moe::quant::quantize_4bit(t, opt.type, opt.double_quant));
  }
  std::vector<moe::SafeTensorView> views;
  for (auto& [name, t] : out) {
    t = t.contiguous();
    views.push_back({name, std::string(moe::safetensors_dtype_of(t.scalar_type())), t.sizes().vec(),
                     t.data_ptr(), static_cast<size_t>(t.nbytes())});
  }
  moe::write_safetensors(argv[2], views);
  return 0;
}
