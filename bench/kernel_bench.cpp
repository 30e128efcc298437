// Kernel benchmark: routing and dispatch ops, the ATen reference against our CUDA kernels, with
// effective bandwidth (each input read once + each output written once, the byte counts in
// src/kernels/*.cu) set against a device copy measured in the same run.
//
//   kernel_bench [--device cpu|cuda] [--tokens T] [--hidden D] [--dtype bf16|fp16|fp32]
//                [--quick] [--json PATH]
// Defaults: T = 16384, D = 4096, E in {8, 64}, k in {2, 8}; bf16 on CUDA, fp32 on the CPU
// (reference path only there). --quick: T = 1024, D = 256, E = 8, k = 2 (the ctest smoke run).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef MOE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "moe/kernels/permute.h"
#include "moe/kernels/rotary.h"
#include "moe/kernels/router.h"
#include "moe/kernels/swiglu.h"
#include "moe/model/transformer.h"
#include "moe/moe/dispatcher.h"
#include "moe/moe/router.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = torch::cuda::is_available() ? "cuda" : "cpu";
  int64_t tokens = 16384, hidden = 4096;
  std::string dtype;
  bool quick = false;
  std::string json_path;
};

// Median milliseconds of `fn` over `reps` timed runs after 2 warm-up runs. On a GPU the time
// between two CUDA events around `fn` on the current stream (the kernels' own time, without the
// host's launch and synchronisation latency); on the CPU the wall clock.
double time_ms(const std::function<void()>& fn, bool cuda, int reps) {
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  for (int i = 0; i < 2; ++i) fn();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
#ifdef MOE_HAVE_CUDA
    if (cuda) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing enabled
      start.record();
      fn();
      stop.record();
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop));
      continue;
    }
#endif
    auto t0 = Clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<size_t>(reps / 2)];
}

torch::ScalarType parse_dtype(const std::string& s) {
  if (s == "bf16") return torch::kBFloat16;
  if (s == "fp16") return torch::kHalf;
  if (s == "fp32") return torch::kFloat;
  throw std::invalid_argument("--dtype must be bf16, fp16 or fp32, got " + s);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--device")
      o.device = next();
    else if (a == "--tokens")
      o.tokens = std::stoll(next());
    else if (a == "--hidden")
      o.hidden = std::stoll(next());
    else if (a == "--dtype")
      o.dtype = next();
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--json")
      o.json_path = next();
    else {
      std::cerr << "kernel_bench: unknown argument " << a << "\n";
      return 2;
    }
  }
  const bool cuda = o.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::cerr << "kernel_bench: --device cuda but no CUDA device is visible\n";
    return 2;
  }
  if (o.quick) o.tokens = 1024, o.hidden = 256;
  if (o.dtype.empty()) o.dtype = cuda ? "bf16" : "fp32";
  const auto dtype = parse_dtype(o.dtype);
  const int64_t elt = torch::elementSize(dtype);
  const bool kernels = cuda && moe::kernels::cuda_kernels_compiled();
  const int reps = o.quick ? 3 : (cuda ? 20 : 5);
  const auto dev = torch::Device(cuda ? torch::kCUDA : torch::kCPU);
  const auto opts = torch::TensorOptions(dev);
  torch::NoGradGuard no_grad_default;  // re-enabled where a backward is timed

  const int64_t T = o.tokens, d = o.hidden;
  // Copy bandwidth: read + write of a [T * 8, d] tensor (large enough to leave the caches).
  auto big = torch::randn({T * 8, d}, opts.dtype(dtype));
  const double copy_ms = time_ms([&] { (void)big.clone(); }, cuda, reps);
  const double copy_gbps = 2.0 * static_cast<double>(big.numel() * elt) / (copy_ms * 1e6);
  big = torch::Tensor();
  std::printf("device %s, dtype %s, copy %.1f GB/s\n", o.device.c_str(), o.dtype.c_str(),
              copy_gbps);

  nlohmann::json rows = nlohmann::json::array();
  auto report = [&](const char* op, const char* path, int64_t E, int64_t k, double ms,
                    double bytes) {
    const double gbps = bytes / (ms * 1e6);
    std::printf("%-14s %-9s T=%lld d=%lld E=%lld k=%lld  %9.3f ms  %8.1f GB/s  (%3.0f%% of copy)\n",
                op, path, static_cast<long long>(T), static_cast<long long>(d),
                static_cast<long long>(E), static_cast<long long>(k), ms, gbps,
                100.0 * gbps / copy_gbps);
    rows.push_back({{"op", op},
                    {"path", path},
                    {"tokens", T},
                    {"hidden", d},
                    {"experts", E},
                    {"top_k", k},
                    {"dtype", o.dtype},
                    {"ms", ms},
                    {"gbps", gbps}});
  };

  const std::vector<int64_t> experts =
      o.quick ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 64};
  const std::vector<int64_t> topks = o.quick ? std::vector<int64_t>{2} : std::vector<int64_t>{2, 8};
  for (int64_t E : experts) {
    for (int64_t k : topks) {
      torch::manual_seed(E * 100 + k);
      auto logits = torch::randn({T, E}, opts);
      auto routed = moe::moe::score_and_select(logits, torch::Tensor(), k, false, true);
      auto keep = torch::ones({T, k}, opts.dtype(torch::kBool));
      moe::moe::DispatchPlan plan = moe::moe::dispatch_plan(routed.topk_idx, keep, E);
      const int64_t N = plan.source_token.numel();
      auto x = torch::randn({T, d}, opts.dtype(dtype));
      auto y = torch::randn({N, d}, opts.dtype(dtype));
      auto w = routed.topk_weight.contiguous();

      // dispatch plan (dropless): read T*k*8 (expert ids); write 2*N*8 (rows) + E*8 (counts).
      const double plan_bytes = static_cast<double>(T * k * 8 + 2 * N * 8 + E * 8);
      report("plan", "reference", E, k,
             time_ms([&] { (void)moe::moe::dispatch_plan(routed.topk_idx, keep, E); }, cuda, reps),
             plan_bytes);
      if (kernels) {
        report("plan", "cuda", E, k,
               time_ms([&] { (void)moe::kernels::detail::dispatch_plan(routed.topk_idx, E); }, cuda,
                       reps),
               plan_bytes);
      }
      // Bytes each implementation must move. permute: the reference gathers one x row per
      // assignment (N*d) and the index (N*8); the kernel reads x once per token (T*d) and the
      // rows of each assignment (T*k*8). Both write N*d.
      const double permute_ref_bytes = static_cast<double>((N * d + N * d) * elt + N * 8);
      const double permute_bytes = static_cast<double>((T * d + N * d) * elt + T * k * 8);
      report("permute", "reference", E, k,
             time_ms([&] { (void)moe::moe::permute(x, plan); }, cuda, reps), permute_ref_bytes);
      // combine: read N*d (y), T*k*4 (weights), T*k*8 (rows of each assignment); write T*d.
      const double combine_bytes =
          static_cast<double>((N * d + T * d) * elt + T * k * 4 + T * k * 8);
      report("combine", "reference", E, k,
             time_ms([&] { (void)moe::moe::combine(y, plan, w, T); }, cuda, reps), combine_bytes);
      if (kernels) {
        auto rows_of = moe::kernels::detail::assignment_rows(plan.source_assignment, T * k);
        report("permute", "cuda", E, k,
               time_ms([&] { (void)moe::kernels::detail::permute_forward(x, rows_of, k, N); }, cuda,
                       reps),
               permute_bytes);
        report("permute_bwd", "cuda", E, k,
               time_ms([&] { (void)moe::kernels::detail::permute_backward(y, rows_of, k); }, cuda,
                       reps),
               static_cast<double>((N * d + T * d) * elt + T * k * 8));
        report("combine", "cuda", E, k,
               time_ms([&] { (void)moe::kernels::detail::combine_forward(y, rows_of, w); }, cuda,
                       reps),
               combine_bytes);
        // combine backward: read the output gradient once per token (T*d) and y (N*d, for the
        // weights' gradient), weights and rows (T*k*12); write grad_y (N*d) and grad_w (T*k*4).
        auto grad_out = torch::randn({T, d}, opts.dtype(dtype));
        report(
            "combine_bwd", "cuda", E, k,
            time_ms([&] { (void)moe::kernels::detail::combine_backward(grad_out, y, rows_of, w); },
                    cuda, reps),
            static_cast<double>((T * d + 2 * N * d) * elt + T * k * 16));
      }

      // Router forward + backward from fp32 logits: probs, top-k, weights, lse; a loss that
      // touches every differentiable output (weights, the aux-loss mean of probs, the z-loss).
      // Bytes: forward and backward byte counts of src/kernels/router.cu.
      const double router_bytes = static_cast<double>(T * E * 4 * 5 + T * k * 24 + T * 8);
      auto gw = torch::randn({T, k}, opts);
      auto ge = torch::rand({E}, opts);
      auto router_step = [&](bool fused) {
        torch::AutoGradMode grad(true);
        auto l = logits.detach().requires_grad_(true);
        torch::Tensor probs, weight, lse;
        if (fused) {
          auto f = moe::kernels::score_and_select(l, torch::Tensor(), k, false, true);
          probs = f.probs, weight = f.topk_weight, lse = f.lse;
        } else {
          auto s = moe::moe::score_and_select(l, torch::Tensor(), k, false, true);
          probs = s.probs, weight = s.topk_weight, lse = s.lse;
        }
        auto loss = (weight * gw).sum() + (probs.mean(0) * ge).sum() + lse.square().mean();
        loss.backward();
      };
      const double ref_ms = time_ms([&] { router_step(false); }, cuda, reps);
      report("router_fwd_bwd", "reference", E, k, ref_ms, router_bytes);
      if (kernels) {
        const double fused_ms = time_ms([&] { router_step(true); }, cuda, reps);
        report("router_fwd_bwd", "cuda", E, k, fused_ms, router_bytes);
        std::printf("router speed-up (reference / fused): %.2fx\n", ref_ms / fused_ms);
      }
    }
  }
  // Rotary embedding of q as attention holds it: a view of a fused [T, 3 d] projection, heads of
  // 128, one [T, 128] table (B = 1, S = T). Both paths must read x and the tables once and write
  // the output once (the reference moves about five times that: neg, cat, two products, a sum).
  {
    const int64_t hd = 128, heads = std::max<int64_t>(d / hd, 1);
    auto proj = torch::randn({1, T, 3 * heads * hd}, opts.dtype(dtype));
    auto q = proj.narrow(-1, 0, heads * hd).reshape({1, T, heads, hd}).transpose(1, 2);
    auto grad = torch::randn({1, heads, T, hd}, opts.dtype(dtype));
    auto cos = torch::rand({T, hd}, opts.dtype(dtype)),
         sin = torch::rand({T, hd}, opts.dtype(dtype));
    const double bytes = static_cast<double>((2 * T * heads * hd + 2 * T * hd) * elt);
    auto fwd_bwd = [&](bool fused) {
      torch::AutoGradMode grad_mode(true);
      auto x = q.detach().requires_grad_(true);
      auto y = fused ? moe::kernels::rotary(x, cos, sin) : moe::model::rotate(x, cos, sin);
      y.backward(grad);
    };
    report("rotary_fwd_bwd", "reference", 0, 0, time_ms([&] { fwd_bwd(false); }, cuda, reps),
           2 * bytes);
    if (kernels) {
      report("rotary", "cuda", 0, 0,
             time_ms([&] { (void)moe::kernels::detail::rotary_apply(q, cos, sin, false); }, cuda,
                     reps),
             bytes);
      report("rotary_bwd", "cuda", 0, 0,
             time_ms([&] { (void)moe::kernels::detail::rotary_apply(grad, cos, sin, true); }, cuda,
                     reps),
             bytes);
      report("rotary_fwd_bwd", "cuda", 0, 0, time_ms([&] { fwd_bwd(true); }, cuda, reps),
             2 * bytes);
    }
  }
  // SwiGLU of the expert FFN's rows: 2 T rows (top-2) of d / 4, as the 1 B config's experts.
  // The fused forward must read gate and up once and write h (3 n b); its backward read dh, gate
  // and up and write both gradients (5 n b). The reference moves 5 n b forward, 9 n b backward.
  {
    const int64_t n_rows = 2 * T, cols = std::max<int64_t>(d / 4, 8);
    auto gate = torch::randn({n_rows, cols}, opts.dtype(dtype)),
         up = torch::randn({n_rows, cols}, opts.dtype(dtype)),
         dh = torch::randn({n_rows, cols}, opts.dtype(dtype));
    const double n_bytes = static_cast<double>(n_rows * cols * elt);
    auto fwd_bwd = [&](bool fused) {
      torch::AutoGradMode grad_mode(true);
      auto g = gate.detach().requires_grad_(true), u = up.detach().requires_grad_(true);
      auto h = fused ? moe::kernels::swiglu(g, u) : moe::kernels::swiglu_reference(g, u);
      h.backward(dh);
    };
    report("swiglu_fwd_bwd", "reference", 0, 0, time_ms([&] { fwd_bwd(false); }, cuda, reps),
           8 * n_bytes);
    if (kernels) {
      report("swiglu", "cuda", 0, 0,
             time_ms([&] { (void)moe::kernels::detail::swiglu_forward(gate, up); }, cuda, reps),
             3 * n_bytes);
      report(
          "swiglu_bwd", "cuda", 0, 0,
          time_ms([&] { (void)moe::kernels::detail::swiglu_backward(dh, gate, up); }, cuda, reps),
          5 * n_bytes);
      report("swiglu_fwd_bwd", "cuda", 0, 0, time_ms([&] { fwd_bwd(true); }, cuda, reps),
             8 * n_bytes);
    }
    // The packed form the grouped experts use (one [rows, 2 cols] gate-up GEMM output): the same
    // bytes for the fused op; the reference adds the concatenation of its two gradients (2 n b
    // more read and written).
    const auto gate_up = torch::cat({gate, up}, 1);
    auto packed_fwd_bwd = [&](bool fused) {
      torch::AutoGradMode grad_mode(true);
      auto gu = gate_up.detach().requires_grad_(true);
      auto h = fused ? moe::kernels::swiglu_packed(gu) : moe::kernels::swiglu_packed_reference(gu);
      h.backward(dh);
    };
    report("swiglu_packed_fwd_bwd", "reference", 0, 0,
           time_ms([&] { packed_fwd_bwd(false); }, cuda, reps), 8 * n_bytes);
    if (kernels) {
      report("swiglu_packed_fwd_bwd", "cuda", 0, 0,
             time_ms([&] { packed_fwd_bwd(true); }, cuda, reps), 8 * n_bytes);
    }
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"device", cuda ? torch::cuda::device_count() > 0 ? "cuda" : "cpu" : "cpu"},
                        {"dtype", o.dtype},
                        {"copy_gbps", copy_gbps},
                        {"cuda_kernels", kernels},
                        {"rows", rows}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  return 0;
}
