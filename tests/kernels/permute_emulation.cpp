// CPU emulations of the permute family's kernels (permute_emulation.h): the dispatch plan's tile
// walk, the row gather, and the fp32 sums of the permute backward and the combine.
#include "permute_emulation.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace moe::kernel_emulation {

using namespace kernel_checks;

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;        // permute.cu kThreads (the combine backward's block)
constexpr int64_t kPlanTile = 1024;  // permute.cu kPlanTile

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

}  // namespace moe::kernel_emulation
