#include "kernel_emulation.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace moe::kernel_emulation {

using namespace kernel_checks;

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;        // permute.cu kThreads (the combine backward's block)
constexpr int64_t kPlanTile = 1024;  // permute.cu kPlanTile

// __shfl_xor_sync butterfly sum over 32 lanes: each level adds lane l and lane l ^ o; fp32 add is
// commutative, so every lane ends with the same value, as on the GPU.
float warp_sum(float (&lane)[kWarp]) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    float next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = lane[l] + lane[l ^ o];
    std::memcpy(lane, next, sizeof next);
  }
  return lane[0];
}

}  // namespace

torch::Tensor assignment_rows(const torch::Tensor& source_assignment, int64_t num_assignments) {
  auto rows = torch::full({num_assignments}, -1, torch::kLong);
  auto sa = source_assignment.contiguous();
  const int64_t* a = sa.data_ptr<int64_t>();
  int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < sa.numel(); ++i) {
    if (a[i] >= 0 && a[i] < num_assignments) r[a[i]] = i;
  }
  return rows;
}

std::array<torch::Tensor, 3> dispatch_plan(const torch::Tensor& topk_idx, int64_t num_experts) {
  auto idx = topk_idx.contiguous();
  const int64_t* ids = idx.data_ptr<int64_t>();
  const int64_t A = idx.numel(), k = idx.size(1), E = num_experts;
  const int64_t tiles = std::max<int64_t>(1, (A + kPlanTile - 1) / kPlanTile);
  // One warp's walk over its tile, 32 assignments at a time: lanes holding the same expert rank
  // themselves by lane order (__match_any_sync + __popc), then that expert's count advances.
  auto walk = [&](int64_t tile, auto&& visit) {
    std::vector<int64_t> running(static_cast<size_t>(E), 0);
    const int64_t begin = tile * kPlanTile;
    if (begin >= A) return running;
    const int64_t end = std::min(begin + kPlanTile, A);
    for (int64_t base = begin; base < end; base += kWarp) {
      int64_t e[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        const int64_t a = base + l;
        const int64_t id = a < end ? ids[a] : -1;
        e[l] = id >= 0 && id < E ? id : -1;  // out of range: no assignment
      }
      int same[kWarp], rank[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        same[l] = rank[l] = 0;
        for (int o = 0; o < kWarp; ++o) {
          if (e[o] != e[l]) continue;
          ++same[l];
          rank[l] += o < l;
        }
        if (e[l] >= 0) visit(base + l, e[l], running[static_cast<size_t>(e[l])] + rank[l]);
      }
      for (int l = 0; l < kWarp; ++l) {
        if (e[l] >= 0 && rank[l] == 0) running[static_cast<size_t>(e[l])] += same[l];
      }
    }
    return running;
  };
  auto tile_counts = torch::zeros({tiles, E}, torch::kLong);
  int64_t* tc = tile_counts.data_ptr<int64_t>();
  for (int64_t t = 0; t < tiles; ++t) {
    auto running = walk(t, [](int64_t, int64_t, int64_t) {});
    std::copy(running.begin(), running.end(), tc + t * E);
  }
  auto tokens_per_expert = tile_counts.sum(0);
  auto expert_start = tokens_per_expert.cumsum(0) - tokens_per_expert;
  auto tile_base = (tile_counts.cumsum(0) - tile_counts + expert_start.unsqueeze(0)).contiguous();
  const int64_t* tb = tile_base.data_ptr<int64_t>();
  auto source_assignment = torch::full({A}, -1, torch::kLong);
  auto source_token = torch::full({A}, -1, torch::kLong);
  int64_t* sa = source_assignment.data_ptr<int64_t>();
  int64_t* st = source_token.data_ptr<int64_t>();
  for (int64_t t = 0; t < tiles; ++t) {
    walk(t, [&](int64_t a, int64_t e, int64_t offset) {
      const int64_t row = tb[t * E + e] + offset;
      sa[row] = a;
      st[row] = a / k;
    });
  }
  return {source_token, source_assignment, tokens_per_expert};
}

torch::Tensor permute_forward(const torch::Tensor& x, const torch::Tensor& source_token) {
  auto xc = x.contiguous();
  const int64_t n = source_token.numel(), rows = xc.size(0);
  const int64_t row_bytes = xc.size(1) * static_cast<int64_t>(xc.element_size());
  auto out = torch::full({n, xc.size(1)}, NAN, xc.options());
  const int64_t* src = source_token.data_ptr<int64_t>();
  const char* in = static_cast<const char*>(xc.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  for (int64_t r = 0; r < n; ++r) {
    if (src[r] < 0 || src[r] >= rows) continue;
    std::memcpy(o + r * row_bytes, in + src[r] * row_bytes, static_cast<size_t>(row_bytes));
  }
  return out;
}

torch::Tensor permute_backward(const torch::Tensor& grad_out, const torch::Tensor& rows,
                               int64_t k) {
  auto g = grad_out.contiguous();
  const int64_t n = g.size(0), d = g.size(1), T = rows.numel() / k;
  auto grad_x = torch::empty({T, d}, g.options());
  const int64_t* rw = rows.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "emu_perm_bwd", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* out = grad_x.data_ptr<scalar_t>();
    at::parallel_for(0, T, 256, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t r = rw[t * k + j];
            if (r >= 0 && r < n) acc += static_cast<float>(gp[r * d + c]);
          }
          out[t * d + c] = static_cast<scalar_t>(acc);
        }
      }
    });
  });
  return grad_x;
}

torch::Tensor combine_forward(const torch::Tensor& y, const torch::Tensor& rows,
                              const torch::Tensor& weights) {
  auto yc = y.contiguous();
  auto w = weights.contiguous();
  const int64_t n = yc.size(0), d = yc.size(1), T = w.size(0), k = w.size(1);
  auto out = torch::empty({T, d}, yc.options());
  const int64_t* rw = rows.data_ptr<int64_t>();
  const float* wp = w.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, yc.scalar_type(), "emu_comb_fwd", [&] {
    const scalar_t* yp = yc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, T, 256, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        for (int64_t c = 0; c < d; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t r = rw[t * k + j];
            // acc += w * y: nvcc contracts it into one fma (one rounding).
            if (r >= 0 && r < n)
              acc = std::fma(wp[t * k + j], static_cast<float>(yp[r * d + c]), acc);
          }
          op[t * d + c] = static_cast<scalar_t>(acc);
        }
      }
    });
  });
  return out;
}

std::pair<torch::Tensor, torch::Tensor> combine_backward(const torch::Tensor& grad_out,
                                                         const torch::Tensor& y,
                                                         const torch::Tensor& source_token,
                                                         const torch::Tensor& source_assignment,
                                                         const torch::Tensor& weights) {
  auto go = grad_out.contiguous();
  auto yc = y.contiguous();
  auto w = weights.contiguous();
  const int64_t n = yc.size(0), d = yc.size(1), T = go.size(0), A = w.numel();
  auto grad_y = torch::full_like(yc, NAN);
  auto grad_w = torch::zeros(w.sizes(), w.options());
  const int64_t* st = source_token.data_ptr<int64_t>();
  const int64_t* sa = source_assignment.data_ptr<int64_t>();
  const float* wp = w.data_ptr<float>();
  float* gw = grad_w.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, yc.scalar_type(), "emu_comb_bwd", [&] {
    const scalar_t* gp = go.data_ptr<scalar_t>();
    const scalar_t* yp = yc.data_ptr<scalar_t>();
    scalar_t* gy = grad_y.data_ptr<scalar_t>();
    at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t t = st[r], a = sa[r];
        if (t < 0 || t >= T || a < 0 || a >= A) continue;
        const float wa = wp[a];
        float partial[kThreads];
        for (int i = 0; i < kThreads; ++i) {  // thread i: columns i, i + 256, ...
          float dot = 0.f;
          for (int64_t c = i; c < d; c += kThreads) {
            const float g = static_cast<float>(gp[t * d + c]);
            gy[r * d + c] = static_cast<scalar_t>(wa * g);
            dot = std::fma(g, static_cast<float>(yp[r * d + c]), dot);
          }
          partial[i] = dot;
        }
        for (int s = kThreads / 2; s > 0; s >>= 1) {  // the kernel's fixed tree
          for (int i = 0; i < s; ++i) partial[i] += partial[i + s];
        }
        gw[a] = partial[0];
      }
    });
  });
  return {grad_y, grad_w};
}

PermuteOutputs permute_all(const PermuteInputs& in) {
  PermuteOutputs out;
  out.rows_of_assignment = assignment_rows(in.source_assignment, in.tokens * in.k);
  out.permuted = permute_forward(in.x, in.source_token);
  out.grad_x = permute_backward(in.grad_permuted, out.rows_of_assignment, in.k);
  out.combined = combine_forward(in.y, out.rows_of_assignment, in.weights);
  auto [gy, gw] =
      combine_backward(in.grad_out, in.y, in.source_token, in.source_assignment, in.weights);
  out.grad_y = gy;
  out.grad_w = gw;
  return out;
}

RouterOutputs router(const RouterInputs& in) {
  auto logits = in.logits.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1), k = in.k;
  const bool normalize = in.normalize && (k > 1 || in.sigmoid);
  const float* lp = logits.data_ptr<float>();
  auto bias = in.bias.defined() ? in.bias.contiguous() : torch::Tensor();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  RouterOutputs out;
  out.probs = torch::full({T, E}, NAN);
  out.topk_idx = torch::full({T, k}, -1, torch::kLong);
  out.topk_weight = torch::full({T, k}, NAN);
  out.lse = torch::full({T}, NAN);
  float* probs = out.probs.data_ptr<float>();
  int64_t* idx = out.topk_idx.data_ptr<int64_t>();
  float* tw = out.topk_weight.data_ptr<float>();
  float* lse = out.lse.data_ptr<float>();

  // router_forward_kernel, one token per "warp": lane l holds experts l, l + 32, ...
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<char> taken(static_cast<size_t>(E));
    for (int64_t t = b; t < end; ++t) {
      const float* v = lp + t * E;
      float m = -FLT_MAX;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, v[e]);
      float lane[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        float s = 0.f;
        for (int64_t e = l; e < E; e += kWarp) s += std::exp(v[e] - m);
        lane[l] = s;
      }
      const float s = warp_sum(lane);
      lse[t] = m + std::log(s);
      for (int64_t e = 0; e < E; ++e) {
        p[static_cast<size_t>(e)] =
            in.sigmoid ? 1.f / (1.f + std::exp(-v[e])) : std::exp(v[e] - m) / s;
        probs[t * E + e] = p[static_cast<size_t>(e)];
      }
      // k rounds of arg-max over keys = scores (+ bias); NaN keys rank lowest; ties -> lower id.
      std::fill(taken.begin(), taken.end(), 0);
      float w[8];
      float wsum = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        float best_key = -INFINITY;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[static_cast<size_t>(e)]) continue;
          float key = bp ? p[static_cast<size_t>(e)] + bp[e] : p[static_cast<size_t>(e)];
          if (std::isnan(key)) key = -INFINITY;
          if (best < 0 || key > best_key) best = e, best_key = key;
        }
        taken[static_cast<size_t>(best)] = 1;
        w[j] = p[static_cast<size_t>(best)];
        wsum += w[j];
        idx[t * k + j] = best;
      }
      const float denom = std::fmax(wsum, 1e-20f);
      for (int64_t j = 0; j < k; ++j) tw[t * k + j] = normalize ? w[j] / denom : w[j];
    }
  });
  out.tokens_per_expert = torch::bincount(out.topk_idx.reshape(-1), {}, E);

  // router_backward_kernel from these outputs and the upstream gradients.
  auto gp_t = in.grad_probs.defined() ? in.grad_probs.contiguous() : torch::Tensor();
  auto gw_t = in.grad_weight.defined() ? in.grad_weight.contiguous() : torch::Tensor();
  auto gl_t = in.grad_lse.defined() ? in.grad_lse.contiguous() : torch::Tensor();
  const float* gpp = gp_t.defined() ? gp_t.data_ptr<float>() : nullptr;
  const float* gwp = gw_t.defined() ? gw_t.data_ptr<float>() : nullptr;
  const float* glp = gl_t.defined() ? gl_t.data_ptr<float>() : nullptr;
  out.grad_logits = torch::empty({T, E});
  float* gout = out.grad_logits.data_ptr<float>();
  at::parallel_for(0, T, 64, [&](int64_t b, int64_t end) {
    std::vector<float> g(static_cast<size_t>(E)), gl(static_cast<size_t>(E));
    for (int64_t t = b; t < end; ++t) {
      const float* p = probs + t * E;
      for (int64_t e = 0; e < E; ++e) g[static_cast<size_t>(e)] = gpp ? gpp[t * E + e] : 0.f;
      if (gwp) {
        float dot = 0.f, S = 0.f;
        for (int64_t j = 0; j < k; ++j) {
          dot = std::fma(gwp[t * k + j], tw[t * k + j], dot);
          S += p[idx[t * k + j]];
        }
        S = std::fmax(S, 1e-20f);
        for (int64_t j = 0; j < k; ++j) {
          const float gw = gwp[t * k + j];
          g[static_cast<size_t>(idx[t * k + j])] += normalize ? (gw - dot) / S : gw;
        }
      }
      if (in.sigmoid) {
        for (int64_t e = 0; e < E; ++e) {
          gl[static_cast<size_t>(e)] = g[static_cast<size_t>(e)] * p[e] * (1.f - p[e]);
        }
      } else {
        float lane[kWarp];
        for (int l = 0; l < kWarp; ++l) {
          float d = 0.f;
          for (int64_t e = l; e < E; e += kWarp) d = std::fma(g[static_cast<size_t>(e)], p[e], d);
          lane[l] = d;
        }
        const float dot = warp_sum(lane);
        for (int64_t e = 0; e < E; ++e) {
          gl[static_cast<size_t>(e)] = p[e] * (g[static_cast<size_t>(e)] - dot);
        }
      }
      const float gz = glp ? glp[t] : 0.f, l = lse[t];
      for (int64_t e = 0; e < E; ++e) {
        const float soft = in.sigmoid ? std::exp(lp[t * E + e] - l) : p[e];
        gout[t * E + e] = std::fma(gz, soft, gl[static_cast<size_t>(e)]);
      }
    }
  });
  return out;
}

GroupedGemmOutputs grouped_gemm(const GroupedGemmInputs& in) {
  const int64_t E = in.b.size(0), N = in.a.size(0);
  auto counts = in.counts.to(torch::kCPU);
  std::vector<torch::Tensor> c, ga;
  auto gb = torch::zeros_like(in.b);
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    auto a = in.a.narrow(0, off, n).to(torch::kFloat);
    auto g = in.grad_c.narrow(0, off, n).to(torch::kFloat);
    auto b = in.b[e].to(torch::kFloat);
    c.push_back(a.mm(b).to(torch::kBFloat16));
    ga.push_back(g.mm(b.t()).to(torch::kBFloat16));
    gb[e] = a.t().mm(g).to(torch::kBFloat16);
    off += n;
  }
  auto cat = [&](std::vector<torch::Tensor>& v, int64_t cols) {
    return v.empty() ? torch::zeros({N, cols}, in.a.options()) : torch::cat(v, 0);
  };
  return {cat(c, in.b.size(2)), cat(ga, in.b.size(1)), gb};
}

ExpertsOutputs experts(const ExpertsInputs& in) {
  auto round_bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  auto x = in.x.detach().requires_grad_(true);
  auto wg = in.w_gate.detach().requires_grad_(true);
  auto wu = in.w_up.detach().requires_grad_(true);
  auto wd = in.w_down.detach().requires_grad_(true);
  auto xb = round_bf16(x), gb = round_bf16(wg), ub = round_bf16(wu), db = round_bf16(wd);
  auto counts = in.counts.to(torch::kCPU);
  std::vector<torch::Tensor> ys;
  int64_t off = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    auto xs = xb.narrow(0, off, n);
    // round_bf16(xs): the identity forward; backward, each GEMM's partial of grad_x is rounded
    // to bf16 before autograd adds the two, as in the bf16 path.
    auto g = round_bf16(round_bf16(xs).mm(gb[e]));
    auto up = round_bf16(round_bf16(xs).mm(ub[e]));
    auto h = round_bf16(round_bf16(torch::silu(g)) * up);
    ys.push_back(round_bf16(h.mm(db[e])));
    off += n;
  }
  auto y = torch::cat(ys, 0);
  auto grads = torch::autograd::grad({y}, {x, wg, wu, wd}, {in.grad_y});
  return {y.detach(), grads[0], grads[1], grads[2], grads[3]};
}

}  // namespace moe::kernel_emulation
