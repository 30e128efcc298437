#include "optimizer_checks.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "moe/optim/adamw.h"
#include "moe/quant/blockwise_quant.h"
#include "train/device_bounds.h"

namespace moe::kernel_checks {

std::vector<Adam8bitCase> adam8bit_cases() {
  // Whole blocks, one value past a block, a partial last block; a loss scale; no weight decay;
  // the first step (bias corrections at their largest).
  return {{4096, 1.0, 0.01, 3},   {4097, 1.0, 0.01, 3}, {70000, 1.0, 0.01, 10},
          {4351, 1024.0, 0.1, 2}, {65536, 1.0, 0.0, 1}, {12345, 65536.0, 0.0, 50}};
}

std::string case_name(const Adam8bitCase& c) {
  std::ostringstream s;
  s << "n" << c.numel << "_scale" << static_cast<int64_t>(c.grad_scale) << "_wd"
    << static_cast<int64_t>(c.weight_decay * 100) << "_t" << c.step;
  return s.str();
}

Adam8bitInputs make_adam8bit_inputs(const Adam8bitCase& c, const torch::Device& device) {
  torch::manual_seed(static_cast<uint64_t>(c.numel * 7 + c.step));
  Adam8bitInputs in;
  in.c = c;
  const int64_t blocks = quant::quant_blocks(c.numel);
  const auto param = torch::randn({c.numel}) * 0.1;
  const auto grad = torch::randn({c.numel}) * 0.05 * c.grad_scale;
  // Moments of changing scale across blocks, with a block of zeros (absmax 0).
  auto m = torch::randn({c.numel}) * 0.01 * torch::linspace(0.1, 2, c.numel);
  auto v = torch::rand({c.numel}) * 1e-4;
  m.slice(0, 0, 256).zero_();
  auto quantise = [&](const torch::Tensor& x, bool is_signed, torch::Tensor& codes,
                      torch::Tensor& absmax) {
    codes = torch::empty({c.numel}, torch::kByte);
    absmax = torch::empty({blocks}, torch::kFloat);
    quant::quantize_blockwise(x, quant::dynamic_map(is_signed, torch::kCPU), codes, absmax);
  };
  quantise(m, true, in.m_codes, in.m_absmax);
  quantise(v, false, in.v_codes, in.v_absmax);
  in.param = param.to(device);
  in.grad = grad.to(device);
  for (torch::Tensor* t : {&in.m_codes, &in.m_absmax, &in.v_codes, &in.v_absmax}) {
    *t = t->to(device);
  }
  return in;
}

kernels::Adam8bitScalars adam8bit_scalars(const Adam8bitInputs& in) {
  const double t = static_cast<double>(in.c.step);
  kernels::Adam8bitScalars s;
  s.beta1 = static_cast<float>(in.beta1);
  s.beta2 = static_cast<float>(in.beta2);
  s.eps = static_cast<float>(in.eps);
  s.one_minus_beta1 = static_cast<float>(1.0 - in.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - in.beta2);
  s.correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(in.beta2, t)));
  s.step_size = static_cast<float>(-in.lr / (1.0 - std::pow(in.beta1, t)));
  s.decay = static_cast<float>(1.0 - in.lr * in.c.weight_decay);
  s.weight_decay = in.c.weight_decay > 0.0;
  s.grad_scale = static_cast<float>(in.c.grad_scale);
  return s;
}

namespace {

// FusedAdamW's reference update on the CPU (its kernel switched off) from the inputs' state.
Adam8bitOutputs reference(const Adam8bitInputs& in) {
  optim::AdamWGroup g{{"p"}, {in.param.cpu().clone()}, in.c.weight_decay};
  optim::MomentPrecision eight{config::StateDtype::k8Bit, config::StateDtype::k8Bit, false};
  optim::FusedAdamW opt({g}, in.beta1, in.beta2, in.eps, {}, eight);
  optim::AdamWState* st = opt.named_state().at(0).second;
  st->exp_avg.copy_(in.m_codes.cpu());
  st->exp_avg_absmax.copy_(in.m_absmax.cpu());
  st->exp_avg_sq.copy_(in.v_codes.cpu());
  st->exp_avg_sq_absmax.copy_(in.v_absmax.cpu());
  st->step.fill_(static_cast<double>(in.c.step - 1));
  g.params[0].mutable_grad() = in.grad.cpu().clone();
  opt.step(in.lr, torch::full({1}, in.c.grad_scale));
  return {g.params[0], st->exp_avg.clone(), st->exp_avg_absmax.clone(), st->exp_avg_sq.clone(),
          st->exp_avg_sq_absmax.clone()};
}

// |got - want| <= rel * (floor + |want|): floor 1 for weights (an absolute bound at their scale),
// 0 for the absmax scales (purely relative: second-moment scales are ~1e-4).
Verdict close(const std::string& name, const torch::Tensor& got, const torch::Tensor& want,
              double rel, double floor) {
  Verdict v;
  v.name = name;
  const auto g = got.cpu().to(torch::kDouble), w = want.to(torch::kDouble);
  const auto bad = (g - w).abs() > rel * (floor + w.abs());
  v.checked = w.numel();
  v.failed = bad.sum().item<int64_t>();
  if (v.failed > 0) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    std::ostringstream s;
    s << "index " << i << ": " << g[i].item<double>() << " vs " << w[i].item<double>();
    v.detail = s.str();
  }
  return v;
}

Verdict codes(const std::string& name, const torch::Tensor& got, const torch::Tensor& want) {
  Verdict v;
  v.name = name;
  const auto g = got.cpu().to(torch::kInt), w = want.to(torch::kInt);
  const auto diff = (g - w).abs();
  v.checked = w.numel();
  const int64_t differ = diff.gt(0).sum().item<int64_t>();
  const int64_t far = diff.gt(1).sum().item<int64_t>();
  if (far > 0 || differ > w.numel() / 1000) {
    v.failed = differ;
    const int64_t i = diff.gt(far > 0 ? 1 : 0).nonzero()[0][0].item<int64_t>();
    std::ostringstream s;
    s << differ << " codes differ (" << far << " by more than one); first at " << i << ": "
      << g[i].item<int>() << " vs " << w[i].item<int>();
    v.detail = s.str();
  }
  return v;
}

// The derived bounds of one step from the state in `in` (fp32 moments dequantised from it).
device_bounds::StepBound step_bound(const Adam8bitInputs& in) {
  device_bounds::AdamW h = device_bounds::kEightBitAdamW;
  h.lr = in.lr, h.beta1 = in.beta1, h.beta2 = in.beta2, h.eps = in.eps;
  h.weight_decay = in.c.weight_decay;
  const auto m = quant::dequantize_blockwise(in.m_codes.cpu(), in.m_absmax.cpu(),
                                             quant::dynamic_map(true, torch::kCPU));
  const auto v = quant::dequantize_blockwise(in.v_codes.cpu(), in.v_absmax.cpu(),
                                             quant::dynamic_map(false, torch::kCPU));
  const auto g = in.grad.cpu().to(torch::kDouble) / in.c.grad_scale;
  return device_bounds::step_bound(h, static_cast<int>(in.c.step), in.param.cpu(), m, v, g);
}

// The largest value of `x` (double, one per parameter value) in each quantisation block.
torch::Tensor block_max(const torch::Tensor& x) {
  const int64_t n = x.numel(), blocks = quant::quant_blocks(n);
  auto padded = torch::zeros({blocks * 256}, x.options());  // 256 values a block; the rest 0
  padded.narrow(0, 0, n).copy_(x.reshape(-1));
  return std::get<0>(padded.view({blocks, 256}).max(1));
}

}  // namespace

torch::Tensor adam8bit_weight_tolerance(const Adam8bitInputs& in) { return step_bound(in).weight; }

std::vector<Verdict> check_adam8bit_pair(const Adam8bitInputs& in, const Adam8bitOutputs& a,
                                         const Adam8bitOutputs& b) {
  device_bounds::AdamW h = device_bounds::kEightBitAdamW;
  h.beta1 = in.beta1, h.beta2 = in.beta2;
  const device_bounds::StepBound bound = step_bound(in);
  const auto m_tol = device_bounds::first_moment_error(h) * block_max(bound.abs_moment);
  const auto v_tol = device_bounds::second_moment_error(h) * block_max(bound.v_new);
  auto absmax = [](const std::string& name, const torch::Tensor& x, const torch::Tensor& y,
                   const torch::Tensor& tol) {
    return within(name, x.cpu(), y.cpu().to(torch::kDouble), tol);
  };
  return {within("param", a.param.cpu(), b.param.cpu().to(torch::kDouble), bound.weight),
          absmax("m_absmax", a.m_absmax, b.m_absmax, m_tol),
          absmax("v_absmax", a.v_absmax, b.v_absmax, v_tol),
          codes("m_codes", a.m_codes, b.m_codes.cpu()),
          codes("v_codes", a.v_codes, b.v_codes.cpu())};
}

std::vector<Verdict> check_adam8bit(const Adam8bitInputs& in, const Adam8bitOutputs& out) {
  const Adam8bitOutputs want = reference(in);
  return {close("param", out.param, want.param, 1e-6, 1.0),
          close("m_absmax", out.m_absmax, want.m_absmax, 1e-6, 0.0),
          close("v_absmax", out.v_absmax, want.v_absmax, 1e-6, 0.0),
          codes("m_codes", out.m_codes, want.m_codes), codes("v_codes", out.v_codes, want.v_codes)};
}

}  // namespace moe::kernel_checks
