// The bounds of the GPU tier tests (train/device_bounds.h, used by train/gpu_tiers_test.cpp) on
// the CPU: ATen's CPU fused AdamW (the offloaded master's update) against an emulation of its CUDA
// kernel in the tier test's setting stays within the bound; the bound admits a drift of one ulp a
// step and the worst drift it claims to admit, and rejects a missing step, a 1e-3 error and a drift
// of 8 ulp a step. The 8-bit pair likewise, one step at a time from a shared state (the GPU test's
// setting and the Adam8bitGpu grid's, whose 1e-6 x (1 + |p|) must not be below the derived bound).
// In moe_kernel_emulation_tests (compiled with -ffp-contract=off: the emulation rounds where its
// kernel does, std::fma where it calls fma).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "kernels/optimizer_checks.h"
#include "kernels/optimizer_emulation.h"
#include "moe/optim/adamw.h"
#include "train/device_bounds.h"

namespace moe::device_bounds {
namespace {

// ATen's CUDA fused AdamW step (fused_adam_utils.cuh: ADAMW, no amsgrad, maximize or grad scale)
// on fp32 host tensors, in the kernel's operations and order: the hyperparameters cast to fp32,
// the bias corrections from powf, std::fma where it calls fma. `contract_decay`: the decay as
// nvcc may contract it, fma(-(lr wd), w, w). `step` is 1-based.
void device_adamw_step(torch::Tensor& w, const torch::Tensor& grad, torch::Tensor& m,
                       torch::Tensor& v, int step, const AdamW& h, bool contract_decay) {
  const float lr = static_cast<float>(h.lr), b1 = static_cast<float>(h.beta1),
              b2 = static_cast<float>(h.beta2), wd = static_cast<float>(h.weight_decay),
              eps = static_cast<float>(h.eps), t = static_cast<float>(step);
  const float bc1 = 1.0f - std::pow(b1, t);
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(b2, t));
  float* pw = w.data_ptr<float>();
  const float* pg = grad.data_ptr<float>();
  float* pm = m.data_ptr<float>();
  float* pv = v.data_ptr<float>();
  for (int64_t i = 0; i < w.numel(); ++i) {
    float p = pw[i];
    const float g = pg[i];
    if (wd != 0.0f) p = contract_decay ? std::fma(-(lr * wd), p, p) : p - lr * wd * p;
    const float ea = std::fma(b1, pm[i], std::fma(-b1, g, g));
    const float gg = g * g;
    const float es = std::fma(b2, pv[i], std::fma(-b2, gg, gg));
    const float step_size = lr / bc1;
    const float denom = std::sqrt(es) / bc2_sqrt + eps;
    pw[i] = p - step_size * ea / denom;
    pm[i] = ea;
    pv[i] = es;
  }
}

// The fp32 weights after each of the tier test's steps (index 0: the initial ones), by the
// emulated CUDA kernel.
std::vector<torch::Tensor> device_run(const TierInputs& in, bool contract_decay) {
  auto w = in.init.to(torch::kFloat), m = torch::zeros_like(w), v = torch::zeros_like(w);
  std::vector<torch::Tensor> ws{w.clone()};
  for (int t = 1; t <= kTierSteps; ++t) {
    device_adamw_step(w, in.grads[t - 1].to(torch::kFloat), m, v, t, kTierAdamW, contract_decay);
    ws.push_back(w.clone());
  }
  return ws;
}

// The same steps by ATen's CPU fused AdamW through FusedAdamW (what the offloaded master runs).
torch::Tensor host_run(const TierInputs& in) {
  auto w = in.init.to(torch::kFloat).requires_grad_(true);
  const AdamW& h = kTierAdamW;
  optim::FusedAdamW opt({{{"w"}, {w}, h.weight_decay}}, h.beta1, h.beta2, h.eps);
  for (int t = 0; t < kTierSteps; ++t) {
    w.mutable_grad() = in.grads[t].to(torch::kFloat);
    opt.step(h.lr);
  }
  return w.detach().clone();
}

// The largest difference, its ratio to the bound, and on the rows in [2, 8) in ulps.
void report(const std::string& what, const Drift& d, const Drift& large) {
  std::cout << "[ bounds   ] " << what << ": max |diff| " << d.max_abs << ", " << d.max_ratio
            << " of the bound, " << large.max_ulps << " ulp in [2, 8); " << d.verdict.failed
            << " of " << d.verdict.checked << " outside\n";
}
void report(const std::string& what, const Drift& d) {
  std::cout << "[ bounds   ] " << what << ": max |diff| " << d.max_abs << ", " << d.max_ratio
            << " of the bound; " << d.verdict.failed << " of " << d.verdict.checked << " outside\n";
}
// Rows 0 and 1: the weights in [2, 8).
Drift compare_large(const torch::Tensor& got, const torch::Tensor& ref, const RunBound& b) {
  const auto g = got.narrow(0, 0, 2), r = ref.narrow(0, 0, 2);
  return compare("[2, 8)", g, r, b.tolerance(r));
}

TEST(DeviceBounds, TierBoundAdmitsTheHostAndDeviceArithmetic) {
  const TierInputs in = tier_inputs();
  const RunBound bound = run_bound(kTierAdamW, kTierSteps);
  const auto host = host_run(in);
  for (bool contract : {false, true}) {
    const auto device = device_run(in, contract).back();
    const Drift d = compare("host vs device", host, device, bound.tolerance(device));
    report(contract ? "host vs device (decay contracted)" : "host vs device", d,
           compare_large(host, device, bound));
    EXPECT_TRUE(d.verdict.ok()) << d.verdict;
  }
  // The two implementations do differ (else this test would show nothing).
  EXPECT_FALSE(torch::equal(host, device_run(in, false).back()));
}

// One ulp a step, fed back into the arithmetic as a rounding difference would be: each weight
// moved one ulp away from zero after each step of the emulated kernel.
TEST(DeviceBounds, TierBoundAdmitsOneUlpAStep) {
  const TierInputs in = tier_inputs();
  const RunBound bound = run_bound(kTierAdamW, kTierSteps);
  const auto plain = device_run(in, false).back();
  auto w = in.init.to(torch::kFloat), m = torch::zeros_like(w), v = torch::zeros_like(w);
  for (int t = 1; t <= kTierSteps; ++t) {
    device_adamw_step(w, in.grads[t - 1].to(torch::kFloat), m, v, t, kTierAdamW, false);
    float* p = w.data_ptr<float>();
    for (int64_t i = 0; i < w.numel(); ++i) p[i] = std::nextafter(p[i], std::copysign(1e30f, p[i]));
  }
  const Drift d = compare("one ulp a step", w, plain, bound.tolerance(plain));
  report("one ulp a step", d, compare_large(w, plain, bound));
  EXPECT_TRUE(d.verdict.ok()) << d.verdict;
  // Weights in [2, 8) (rows 0 and 1) drifted by about 6 ulp: more than the old 1e-6 admitted.
  EXPECT_GT((w.narrow(0, 0, 2) - plain.narrow(0, 0, 2)).abs().max().item<double>(), 1e-6);
}

// The worst drift the bound claims to admit, added to the emulated kernel's trajectory in double
// (not fed back: the rounding of a second run would add to it): floor(k_w) ulps of the weight's
// magnitude at each step plus rho_t of that step's update, all away from zero. Admitted only if
// every update is within lr R_t and every magnitude within W, as the derivation says.
TEST(DeviceBounds, TierBoundAdmitsTheWorstDriftItClaims) {
  const TierInputs in = tier_inputs();
  const RunBound bound = run_bound(kTierAdamW, kTierSteps);
  const auto ws = device_run(in, false);
  const double k = std::floor(weight_ulps_per_step(kTierAdamW));
  EXPECT_EQ(k, 3.0);
  auto offset = torch::zeros_like(ws[0], torch::kDouble);
  for (int t = 1; t <= kTierSteps; ++t) {
    const auto cur = ws[t].to(torch::kDouble), prev = ws[t - 1].to(torch::kDouble);
    const auto update = (cur - prev * (1 - kTierAdamW.lr * kTierAdamW.weight_decay)).abs();
    const auto ulps = kernel_checks::ulp(cur, torch::kFloat);
    // |update| <= lr R_t, measured through two roundings of the weight.
    EXPECT_LE((update - 2 * ulps).max().item<double>(),
              kTierAdamW.lr * update_ratio(kTierAdamW, t) * (1 + 1e-5))
        << "step " << t;
    offset += k * ulps + update_error(kTierAdamW, t, t) * update;
  }
  const auto plain = ws.back().to(torch::kDouble);
  const auto drifted = plain + offset * torch::where(plain < 0, -1.0, 1.0);
  const Drift d = compare("worst admitted", drifted, plain, bound.tolerance(plain));
  report("worst admitted drift", d);
  EXPECT_TRUE(d.verdict.ok()) << d.verdict;
  EXPECT_GT(d.max_ratio, 0.5);  // it is near the bound somewhere
}

TEST(DeviceBounds, TierBoundRejectsAMissingStepAnErrorAndEightUlpAStep) {
  const TierInputs in = tier_inputs();
  const RunBound bound = run_bound(kTierAdamW, kTierSteps);
  const auto ws = device_run(in, false);
  const auto last = ws.back(), tol = bound.tolerance(last);
  // A missing step: nearly every weight outside (an update of lr x R ~ 1e-2 against ~1e-6).
  const Drift missing = compare("missing step", ws[kTierSteps - 1], last, tol);
  report("a missing step", missing);
  EXPECT_GT(missing.verdict.failed, missing.verdict.checked * 99 / 100);
  // 1e-3 on one weight in [2, 8) and on one small one: exactly those outside.
  auto off = last.clone();
  off[0][150] += 1e-3;
  off[2][10] += 1e-3;
  const Drift one = compare("1e-3", off, last, tol);
  EXPECT_EQ(one.verdict.failed, 2) << one.verdict;
  // 8 ulp a step on the rows in [2, 8): every one of them outside.
  auto drifted = last.narrow(0, 0, 2).to(torch::kDouble).clone();
  drifted += 8 * kTierSteps * kernel_checks::ulp(drifted, torch::kFloat) *
             torch::where(drifted < 0, -1.0, 1.0);
  const Drift eight = compare("8 ulp a step", drifted, last.narrow(0, 0, 2), tol.narrow(0, 0, 2));
  report("8 ulp a step in [2, 8)", eight);
  EXPECT_EQ(eight.verdict.failed, eight.verdict.checked);
}

TEST(DeviceBounds, TierBoundNumbers) {
  // The derivation's figures (device_bounds.h): k_w, rho_t, and the bound at 4 and at 1e-3.
  const RunBound b = run_bound(kTierAdamW, kTierSteps);
  EXPECT_NEAR(weight_ulps_per_step(kTierAdamW), 3.004, 1e-9);
  for (int t = 1; t <= kTierSteps; ++t) EXPECT_LT(update_error(kTierAdamW, t, t), 1.2e-5) << t;
  EXPECT_NEAR(b.update, 5.8e-7, 0.05e-7);
  EXPECT_NEAR(b.tolerance(4.0), 18.024 * 0x1p-21 + b.update, 1e-12);
  EXPECT_LT(b.tolerance(1e-3), 1e-6);
  EXPECT_DOUBLE_EQ(update_ratio(kTierAdamW, 1), 1.0);
  std::cout << "[ bounds   ] tier: k_w " << weight_ulps_per_step(kTierAdamW) << ", update part "
            << b.update << ", bound at 4: " << b.tolerance(4.0)
            << ", at 1e-3: " << b.tolerance(1e-3) << "\n";
}

// ---- the 8-bit pair ----------------------------------------------------------------------------

// The GPU test's setting on the CPU: FusedAdamW's 8-bit reference update against the kernel's
// emulation, each step from the reference's state; the pair's verdicts (check_adam8bit_pair) pass,
// and a weight moved by 1e-6 (a thousandth of an update) fails.
TEST(DeviceBounds, EightBitStepBoundAdmitsTheKernelArithmetic) {
  torch::manual_seed(5);
  const auto w0 = torch::randn({96, 80}) * 0.1;
  auto w = w0.clone().requires_grad_(true);
  const optim::MomentPrecision eight{config::StateDtype::k8Bit, config::StateDtype::k8Bit};
  const AdamW& h = kEightBitAdamW;
  optim::FusedAdamW opt({{{"w"}, {w}, h.weight_decay}}, h.beta1, h.beta2, h.eps, {}, eight);
  optim::AdamWState* st = opt.named_state()[0].second;
  for (int t = 1; t <= kEightBitSteps; ++t) {
    kernel_checks::Adam8bitInputs in;
    in.c = {w.numel(), 1.0, h.weight_decay, t};
    in.lr = h.lr, in.beta1 = h.beta1, in.beta2 = h.beta2, in.eps = h.eps;
    in.param = w.detach().reshape(-1).clone();
    in.grad = torch::randn_like(w0).reshape(-1);
    in.m_codes = st->exp_avg.reshape(-1).clone(), in.m_absmax = st->exp_avg_absmax.clone();
    in.v_codes = st->exp_avg_sq.reshape(-1).clone(), in.v_absmax = st->exp_avg_sq_absmax.clone();
    const kernel_checks::Adam8bitOutputs kernel = kernel_emulation::adam8bit_step(in);
    w.mutable_grad() = in.grad.view_as(w0).clone();
    opt.step(h.lr);
    const kernel_checks::Adam8bitOutputs ref{
        w.detach().reshape(-1).clone(), st->exp_avg.reshape(-1).clone(), st->exp_avg_absmax,
        st->exp_avg_sq.reshape(-1).clone(), st->exp_avg_sq_absmax};
    const auto vs = kernel_checks::check_adam8bit_pair(in, kernel, ref);
    EXPECT_TRUE(kernel_checks::all_ok(vs, nullptr)) << "step " << t << kernel_checks::failures(vs);
    auto bad = kernel;
    bad.param = kernel.param.clone();
    bad.param[100] += 1e-6;
    const auto bad_vs = kernel_checks::check_adam8bit_pair(in, bad, ref);
    EXPECT_FALSE(kernel_checks::find(bad_vs, "param").ok()) << "step " << t;
  }
}

// The Adam8bitGpu grid's weight bound, 1e-6 x (1 + |p|), admits the derived one everywhere.
TEST(DeviceBounds, EightBitGridBoundAdmitsTheDerivedOne) {
  for (const auto& c : kernel_checks::adam8bit_cases()) {
    const auto in = kernel_checks::make_adam8bit_inputs(c, torch::Device(torch::kCPU));
    const auto derived = kernel_checks::adam8bit_weight_tolerance(in);
    const auto grid = 1e-6 * (1 + in.param.to(torch::kDouble).abs());
    const double worst = (derived / grid).max().item<double>();
    std::cout << "[ bounds   ] " << kernel_checks::case_name(c) << ": derived / grid bound at most "
              << worst << "\n";
    EXPECT_LE(worst, 1.0) << kernel_checks::case_name(c);
  }
}

}  // namespace
}  // namespace moe::device_bounds
