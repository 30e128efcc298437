// Bounds for an AdamW step taken by two fp32 implementations that round differently, derived
// from their arithmetic: ATen's fused AdamW on the host (aten/src/ATen/native/cpu/
// FusedAdamKernel.cpp, what an offloaded master runs) against the same op on a CUDA device
// (aten/src/ATen/native/cuda/fused_adam_utils.cuh, the device master), and the 8-bit reference
// update (FusedAdamW::update_reference: ATen ops on the host) against its kernel
// (src/kernels/adam8bit.cu). Used by train/gpu_tiers_test.cpp on a device; device_bounds_test.cpp
// feeds the same functions, on the CPU, the worst drift they admit and errors they must reject.
//
// How the two sides round (torch 2.11; u = 2^-24, the fp32 unit roundoff: |fl(x) - x| <= u|x|):
//  - host: 1 - beta1^t, lr / that (the step size) and sqrt(1 - beta2^t) in double, each rounded
//    to fp32 once; beta2, 1 - beta1, 1 - beta2, eps and 1 - lr wd rounded from double; the first
//    moment by lerp, m + fl(1 - beta1) (g - m) (an fma); v = v beta2 + (1 - beta2) g g; decay
//    w fl(1 - lr wd); then w + (-step) m / (sqrt(v) / sqrt(bc2) + eps).
//  - device: lr, beta1, beta2, wd, eps rounded to fp32 first; 1 - powf(beta1, t) and
//    sqrtf(1 - powf(beta2, t)) in fp32 (powf: at most 4 ulp, CUDA programming guide);
//    m = fma(beta1, m, fma(-beta1, g, g)), v likewise on fl(g g); decay w - (lr wd) w (which nvcc
//    may contract into an fma: one rounding fewer, covered).
//  - 8-bit reference and kernel: the same fp32 scalars (from the same double formulas) and the
//    kernel in the reference's order; they differ only where a CPU build contracts a * b + c.
//
// The bound, per element, the two sides' errors against exact arithmetic added:
//  1. Moments. Each side computes m_t = a m + b g with |a - beta1|, |b - (1 - beta1)| <= e1 (the
//     fp32 representation errors of beta1 and 1 - beta1; 0 where both sides use the same floats)
//     and at most 3 roundings, each <= u M_t for the absolute moment M_t = beta1 M_{t-1} +
//     (1 - beta1)|g_t| (|m_{t-1}| <= M_t / beta1, |g_t| <= M_t / (1 - beta1); the lerp's g - m
//     enters times 1 - beta1). So the sides differ by <= eps_m M_t, eps_m = 6u + 2 e1 (1/beta1 +
//     1/(1 - beta1)); a difference carried from step k decays by beta1 and beta1^(t-k) M_k <=
//     M_t, so after s steps from equal states: s eps_m M_t. v: all terms >= 0, at most 4
//     roundings each <= u v_t: eps_v = 8u + 2 e2 (1/beta2 + 1/(1 - beta2)) relative, s eps_v
//     after s steps.
//  2. Step scalars, relative: host u each (step size, sqrt(bc2), eps); device: step size
//     k1 (t d1 / beta1 + 8u) + 3u with k1 = beta1^t / (1 - beta1^t), which amplifies the error of
//     powf(fl(beta1), t) (t d1 / beta1 from fl(beta1), 4 ulp <= 8u from powf) in 1 - beta1^t;
//     sqrt(bc2): (k2 (t d2 / beta2 + 8u) + u) / 2 + u; eps u. 0 where the scalars are shared.
//  3. The update U = step m / (sqrt(v) / sqrt(bc2) + eps), 3 roundings in the denominator and 2
//     in U per side: the sides' updates differ by <= rho_t S_t with rho_t = s eps_m + s eps_v / 2
//     + both sides' scalar errors + 10u (times 1 + 1e-3 for the products of small terms), where
//     S_t = (lr / bc1) M_t / (sqrt(v_t / bc2) + eps). From zero moments, by Cauchy-Schwarz
//     M_t <= (1 - beta1) sqrt(sum_{j<t} (beta1^2 / beta2)^j) sqrt(v_t / (1 - beta2)), so
//     S_t <= lr R_t, R_t = (1 - beta1) sqrt(bc2 sum_{j<t} (beta1^2 / beta2)^j / (1 - beta2)) / bc1
//     (R_1 = 1: Adam's first step is lr sign(g)).
//  4. The weight: per step and side, the decay coefficient (host fl(1 - lr wd): <= u|w| <=
//     1 ulp(w); device fl(fl(lr) fl(wd)): <= 4u lr wd |w|) and two roundings of <= 1/2 ulp(W)
//     each (decay, update): host 2, device 1 + 4 lr wd ulp(W) a step (1/2 each without decay; 1
//     each where the coefficient is shared), with W >= every magnitude the weight passes through:
//     W = (|w_N| + sum_t S_t) / (1 - lr wd)^N. A carried difference decays by 1 - lr wd <= 1.
//  After N steps from equal weights and zero moments:
//     |w_host - w_device| <= N k_w ulp(W) + sum_t rho_t lr R_t.
// Numbers for the tier test (lr 1e-2, betas 0.9 / 0.95, wd 0.1, 6 steps): k_w = 3.004 ulp a step
// and rho_t <= 1.2e-5, so 18 ulp(W) + 5.8e-7: 9.2e-6 for a weight in [4, 8), where the old 1e-6
// absolute bound was 2 ulp and failed at a few. The 8-bit pair (shared scalars, one step from a
// shared state): k_w = 2, rho = 1.2e-6.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/check_util.h"

namespace moe::device_bounds {

constexpr double kU = 0x1p-24;         // fp32 unit roundoff
constexpr double kPowfUlps = 4.0;      // CUDA's powf, maximum error in ulps
constexpr double kHigherOrder = 1e-3;  // products of small terms, rounded up

// fp32 ulp at magnitude |x| (2^-149 among the subnormals).
inline double ulp32(double x) {
  x = std::fabs(x);
  if (x < 0x1p-126) return 0x1p-149;
  int e = 0;
  std::frexp(x, &e);  // x = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

// |fl32(x) - x|: the representation error of x in fp32.
inline double fp32_error(double x) {
  return std::fabs(static_cast<double>(static_cast<float>(x)) - x);
}

enum class Side {
  kHost,    // scalars from double, rounded to fp32 once (ATen's CPU fused AdamW, the 8-bit pair)
  kDevice,  // scalars in fp32 from fp32 betas with powf (ATen's CUDA fused AdamW)
};

struct AdamW {
  double lr, beta1, beta2, eps, weight_decay;
  Side a = Side::kHost, b = Side::kDevice;
  // Both sides use the same fp32 coefficients and step scalars (the 8-bit reference and kernel):
  // their representation errors cancel.
  bool shared_scalars = false;
};

// The tier test's optimizer (gpu_tiers_test.cpp, SixteenBitWeightsGpu): host against device.
constexpr AdamW kTierAdamW{1e-2, 0.9, 0.95, 1e-8, 0.1};
constexpr int kTierSteps = 6;
// The 8-bit test's (MomentPrecisionGpu.EightBitUpdateMatchesTheCpu): the reference update on the
// host against the kernel, shared scalars.
constexpr AdamW kEightBitAdamW{1e-3, 0.9, 0.999, 1e-8, 0.01, Side::kHost, Side::kHost, true};
constexpr int kEightBitSteps = 5;

// The tier test's weights and gradients (bf16, on the CPU): randn, with rows of weights in
// [2, 8) of both signs (one ulp 2.4e-7 to 4.8e-7: where a 1e-6 absolute bound failed) and of small
// ones (1e-6 to 0.1: where the update's relative error dominates).
struct TierInputs {
  torch::Tensor init;                // [256, 300] bf16
  std::vector<torch::Tensor> grads;  // kTierSteps x [256, 300] bf16
};
inline TierInputs tier_inputs() {
  torch::manual_seed(9);
  auto w = torch::randn({256, 300});
  w[0] = torch::linspace(2.0, 7.95, 300);  // below 8 after the rounding to bf16
  w[1] = -torch::linspace(2.0, 7.95, 300);
  w[2] = torch::logspace(-6, -1, 300);
  TierInputs in;
  in.init = w.to(torch::kBFloat16);
  for (int s = 0; s < kTierSteps; ++s) {
    in.grads.push_back((torch::randn({256, 300}) * 0.3).to(torch::kBFloat16));
  }
  return in;
}

// eps_m (relative to the absolute moment M_t) and eps_v (relative to v_t): one step's difference
// of the two sides' moments from equal states (item 1).
inline double first_moment_error(const AdamW& h) {
  const double b1 = h.beta1;
  const double e1 = h.shared_scalars ? 0.0 : std::max(fp32_error(b1), fp32_error(1 - b1));
  return (6 * kU + 2 * e1 * (1 / b1 + 1 / (1 - b1))) * (1 + kHigherOrder);
}
inline double second_moment_error(const AdamW& h) {
  const double b2 = h.beta2;
  const double e2 = h.shared_scalars ? 0.0 : std::max(fp32_error(b2), fp32_error(1 - b2));
  return (8 * kU + 2 * e2 * (1 / b2 + 1 / (1 - b2))) * (1 + kHigherOrder);
}

// One side's relative error in its step scalars at step t (item 2).
inline double scalar_error(const AdamW& h, Side s, int t) {
  if (h.shared_scalars) return 0.0;
  if (s == Side::kHost) return 3 * kU;
  const double p1 = std::pow(h.beta1, t), p2 = std::pow(h.beta2, t);
  const double k1 = p1 / (1 - p1), k2 = p2 / (1 - p2);
  const double pow_err = 2 * kPowfUlps * kU;  // an ulp is at most 2u of the value
  const double step = k1 * (t * fp32_error(h.beta1) / h.beta1 + pow_err) + 3 * kU;
  const double bc2_sqrt = (k2 * (t * fp32_error(h.beta2) / h.beta2 + pow_err) + kU) / 2 + kU;
  return step + bc2_sqrt + kU;
}

// rho: the relative difference of the two sides' updates at step t (1-based), `steps` steps
// after their moments were equal (item 3), in units of S_t.
inline double update_error(const AdamW& h, int t, int steps) {
  return (steps * first_moment_error(h) + steps * second_moment_error(h) / 2 +
          scalar_error(h, h.a, t) + scalar_error(h, h.b, t) + 10 * kU) *
         (1 + kHigherOrder);
}

// R_t: |update| <= lr R_t at step t of a run from zero moments (item 3).
inline double update_ratio(const AdamW& h, int t) {
  const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
  const double r = h.beta1 * h.beta1 / h.beta2;
  double sum = 0.0, term = 1.0;
  for (int j = 0; j < t; ++j, term *= r) sum += term;
  return (1 - h.beta1) * std::sqrt(bc2 * sum / (1 - h.beta2)) / bc1;
}

// k_w: both sides' roundings of the weight in one step, in ulps of its magnitude (item 4).
inline double weight_ulps_per_step(const AdamW& h) {
  auto side = [&](Side s) {
    if (h.weight_decay == 0.0) return 0.5;
    if (h.shared_scalars) return 1.0;
    return s == Side::kHost ? 2.0 : 1.0 + 4 * h.lr * h.weight_decay;
  };
  return side(h.a) + side(h.b);
}

// The bound after `steps` steps from equal weights and zero moments.
struct RunBound {
  int steps = 0;
  double ulps = 0;    // N k_w: in ulps of W
  double update = 0;  // sum_t rho_t lr R_t (absolute)
  double travel = 0;  // sum_t lr R_t: how far the updates can move a weight
  double shrink = 1;  // (1 - lr wd)^N
  // The largest magnitude a weight ending at |w| passed through.
  double magnitude(double w) const { return (std::fabs(w) + travel) / shrink; }
  double tolerance(double w) const { return ulps * ulp32(magnitude(w)) + update; }
  // Elementwise, as a double tensor, for the final weights w.
  torch::Tensor tolerance(const torch::Tensor& w) const {
    const auto mag = (w.to(torch::kDouble).abs() + travel) / shrink;
    return ulps * kernel_checks::ulp(mag, torch::kFloat) + update;
  }
};

inline RunBound run_bound(const AdamW& h, int steps) {
  RunBound b;
  b.steps = steps;
  b.ulps = steps * weight_ulps_per_step(h);
  for (int t = 1; t <= steps; ++t) {
    b.update += update_error(h, t, t) * h.lr * update_ratio(h, t);
    b.travel += h.lr * update_ratio(h, t);
  }
  b.shrink = std::pow(1 - h.lr * h.weight_decay, steps);
  return b;
}

// One step (1-based t) from the same state on both sides, whatever that state: S from the state
// itself, w_prev the weights before the step and m_prev, v_prev the fp32 moments the step reads
// (dequantised), g the gradient (unscaled). Double tensors of w_prev's shape: the weights'
// tolerance, and the absolute moment M and S (for the absmax bounds).
struct StepBound {
  torch::Tensor weight, abs_moment, v_new;
};
inline StepBound step_bound(const AdamW& h, int t, const torch::Tensor& w_prev,
                            const torch::Tensor& m_prev, const torch::Tensor& v_prev,
                            const torch::Tensor& g) {
  const auto f64 = torch::kDouble;
  const auto w = w_prev.to(f64), m = m_prev.to(f64), v = v_prev.to(f64), gr = g.to(f64);
  const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
  StepBound b;
  b.abs_moment = h.beta1 * m.abs() + (1 - h.beta1) * gr.abs();
  b.v_new = h.beta2 * v + (1 - h.beta2) * gr * gr;
  const auto S = (h.lr / bc1) * b.abs_moment / ((b.v_new / bc2).sqrt() + h.eps);
  const auto W = w.abs() + S;  // the decay only shrinks it
  b.weight =
      weight_ulps_per_step(h) * kernel_checks::ulp(W, torch::kFloat) + update_error(h, t, 1) * S;
  return b;
}

// |got - ref| against a tolerance: a verdict (every element), the largest |got - ref| / tol, the
// largest |got - ref| and the largest in fp32 ulps of |ref| (for the test's report).
struct Drift {
  kernel_checks::Verdict verdict;
  double max_ratio = 0, max_abs = 0, max_ulps = 0;
};
inline Drift compare(const std::string& name, const torch::Tensor& got, const torch::Tensor& ref,
                     const torch::Tensor& tol) {
  Drift d;
  const auto r = ref.cpu().to(torch::kDouble), g = got.cpu().to(torch::kDouble);
  const auto t = tol.cpu().to(torch::kDouble);
  d.verdict = kernel_checks::within(name, g, r, t);
  const auto diff = (g - r).abs();
  d.max_ratio = (diff / t).max().item<double>();
  d.max_abs = diff.max().item<double>();
  d.max_ulps = (diff / kernel_checks::ulp(r, torch::kFloat)).max().item<double>();
  return d;
}

}  // namespace moe::device_bounds
