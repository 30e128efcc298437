#include "rotary_checks.h"

#include <torch/torch.h>

#include "moe/model/transformer.h"

namespace moe::kernel_checks {

std::vector<RotaryCase> rotary_cases() {
  std::vector<RotaryCase> v;
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t hd : {2, 6, 16, 64, 128}) {
      for (bool view : {false, true}) {
        for (bool docs : {false, true}) v.push_back({dt, 2, 3, 5, hd, view, docs});
      }
    }
  }
  v.push_back({torch::kBFloat16, 2, 16, 256, 128, true, false});
  return v;
}

std::string case_name(const RotaryCase& c) {
  const char* dt = c.dtype == torch::kFloat ? "fp32" : c.dtype == torch::kHalf ? "fp16" : "bf16";
  return std::string(dt) + "_B" + std::to_string(c.B) + "_N" + std::to_string(c.N) + "_S" +
         std::to_string(c.S) + "_hd" + std::to_string(c.hd) + (c.projection_view ? "_view" : "") +
         (c.per_document ? "_docs" : "");
}

RotaryInputs make_rotary_inputs(const RotaryCase& c, const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(c.hd * 131 + c.S));
  const auto opts = torch::TensorOptions(device).dtype(c.dtype);
  RotaryInputs in;
  if (c.projection_view) {  // q of a fused projection [B, S, (N + 2 N) hd], as attention has it
    const auto proj = torch::randn({c.B, c.S, 3 * c.N * c.hd}, opts);
    in.x = proj.narrow(-1, c.N * c.hd, c.N * c.hd).reshape({c.B, c.S, c.N, c.hd}).transpose(1, 2);
  } else {
    in.x = torch::randn({c.B, c.N, c.S, c.hd}, opts);
  }
  const std::vector<int64_t> table =
      c.per_document ? std::vector<int64_t>{c.B, 1, c.S, c.hd} : std::vector<int64_t>{c.S, c.hd};
  in.cos = torch::rand(table, opts) * 2 - 1;
  in.sin = torch::rand(table, opts) * 2 - 1;
  in.grad = torch::randn({c.B, c.N, c.S, c.hd}, opts);
  return in;
}

std::vector<Verdict> check_rotary(const RotaryInputs& in, const RotaryOutputs& got) {
  torch::Tensor out_ref, grad_ref;
  {
    torch::AutoGradMode on(true);
    const auto x = in.x.detach().requires_grad_(true);  // the same strides as the kernel saw
    out_ref = model::rotate(x, in.cos, in.sin);
    out_ref.backward(in.grad);
    grad_ref = x.grad();
  }
  return {exact("out", got.out, out_ref.detach()), exact("grad_x", got.grad_x, grad_ref)};
}

}  // namespace moe::kernel_checks
