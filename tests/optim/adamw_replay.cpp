// Replays AdamW steps of our optimizer on given tensors, for
// tests/optim/optimizer_precision_test.py to compare with bitsandbytes' 8-bit AdamW (the oracle) on
// the same inputs.
//   adamw_replay IN.safetensors OUT.safetensors EXP_AVG_DTYPE EXP_AVG_SQ_DTYPE
// IN: "param" (fp32), "grad.0" ... "grad.{steps-1}" (fp32, param's shape); metadata "lr",
// "beta1", "beta2", "eps", "weight_decay". OUT: "param" after the steps, "exp_avg" and
// "exp_avg_sq" in fp32, their raw storage ("exp_avg.raw", "exp_avg_sq.raw", and for 8-bit
// "exp_avg.absmax", "exp_avg_sq.absmax"), and the two dynamic maps ("map.signed", "map.unsigned").
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moe/config/choices.h"
#include "moe/optim/adamw.h"
#include "moe/quant/blockwise_quant.h"
#include "moe/util/safetensors.h"
#include "util/read_f32.h"

namespace {

using moe::test::read_f32;

const char* dtype_of(const torch::Tensor& t) {
  return t.scalar_type() == torch::kByte       ? "U8"
         : t.scalar_type() == torch::kBFloat16 ? "BF16"
                                               : "F32";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: adamw_replay IN OUT EXP_AVG_DTYPE EXP_AVG_SQ_DTYPE\n");
    return 2;
  }
  using moe::config::StateDtype;
  const moe::SafetensorsFile in(argv[1]);
  auto meta = [&](const char* k) { return std::stod(in.metadata().at(k)); };
  moe::optim::MomentPrecision precision{*moe::config::parse_choice<StateDtype>(argv[3]),
                                        *moe::config::parse_choice<StateDtype>(argv[4])};
  torch::Tensor p = read_f32(in, "param").requires_grad_(true);
  moe::optim::FusedAdamW opt({{{"param"}, {p}, meta("weight_decay")}}, meta("beta1"), meta("beta2"),
                             meta("eps"), {}, precision);
  for (int k = 0; in.has("grad." + std::to_string(k)); ++k) {
    p.mutable_grad() = read_f32(in, "grad." + std::to_string(k));
    opt.step(meta("lr"));
  }
  auto* st = opt.named_state().at(0).second;
  std::vector<std::pair<std::string, torch::Tensor>> out = {
      {"param", p.detach()},
      {"exp_avg", moe::optim::moment_fp32(*st, 0).clone()},
      {"exp_avg_sq", moe::optim::moment_fp32(*st, 1).clone()},
      {"exp_avg.raw", st->exp_avg},
      {"exp_avg_sq.raw", st->exp_avg_sq},
      {"map.signed", moe::quant::dynamic_map(true, torch::kCPU)},
      {"map.unsigned", moe::quant::dynamic_map(false, torch::kCPU)}};
  if (st->exp_avg_absmax.defined()) out.emplace_back("exp_avg.absmax", st->exp_avg_absmax);
  if (st->exp_avg_sq_absmax.defined()) out.emplace_back("exp_avg_sq.absmax", st->exp_avg_sq_absmax);
  std::vector<moe::SafeTensorView> views;
  for (auto& [name, t] : out) {
    t = t.contiguous();
    views.push_back(
        {name, dtype_of(t), t.sizes().vec(), t.data_ptr(), static_cast<size_t>(t.nbytes())});
  }
  moe::write_safetensors(argv[2], views);
  return 0;
}
