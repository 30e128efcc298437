// CPU emulations of the permute family's kernels (permute_emulation.h): the dispatch plan's tile
// walk, and the per-token row kernels run through their own bodies (moe/kernels/permute_token.h)
// for every token and lane, with the cross-lane butterfly of the combine backward spelled out.
#include "permute_emulation.h"

#include "moe/kernels/permute_token.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace moe::kernel_emulation {

using namespace kernel_checks;

namespace {

constexpr int kWarp = 32;
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

namespace {

namespace tr = ::moe::kernels::token_rows;

// The launch shape the CUDA launcher picks for these tensors.
tr::TokenLayout layout_for(int64_t d, int64_t elem_size, std::initializer_list<const void*> bases) {
  return tr::token_layout(d, elem_size, tr::rows_aligned16(d, elem_size, bases));
}

// Lanes of one token that run: all of them, or (kHalfTheLanes) the first half, while the stride
// still assumes them all: the packs of the missing lanes stay unwritten.
int running_lanes(const tr::TokenLayout& l, EmulatedFault fault) {
  return fault == EmulatedFault::kHalfTheLanes ? std::max(1, l.lanes / 2) : l.lanes;
}

// The k the kernel believes in (kLastAssignmentSkipped: one fewer).
int64_t kernel_k(int64_t k, EmulatedFault fault) {
  return fault == EmulatedFault::kLastAssignmentSkipped && k > 1 ? k - 1 : k;
}

}  // namespace

torch::Tensor permute_forward(const torch::Tensor& x, const torch::Tensor& rows, int64_t k,
                              int64_t num_rows, EmulatedFault fault) {
  auto xc = x.contiguous();
  const int64_t T = xc.size(0), d = xc.size(1);
  auto out = torch::full({num_rows, d}, NAN, xc.options());
  if (T == 0 || d == 0 || num_rows == 0) return out;
  const auto l = layout_for(d, xc.element_size(), {xc.data_ptr(), out.data_ptr()});
  const int64_t* rw = rows.data_ptr<int64_t>();
  const int64_t kk = kernel_k(k, fault);
  tr::with_row_dtype(xc.scalar_type(), "permute", [&](auto tag) {
    using T_ = decltype(tag);
    tr::with_row_shape<T_>(kk, l.vec, [&](auto K, auto V) {
      const T_* xp = xc.data_ptr<T_>();
      T_* op = out.data_ptr<T_>();
      at::parallel_for(0, T, 64, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          for (int lane = 0; lane < running_lanes(l, fault); ++lane) {
            tr::scatter_row_lane<decltype(K)::value, decltype(V)::value>(
                xp + t * d, num_rows, rw + t * k, kk, l, lane, op);
          }
        }
      });
    });
  });
  return out;
}

namespace {
torch::Tensor sum_rows(const torch::Tensor& src, const torch::Tensor& rows,
                       const torch::Tensor& weights, int64_t k, EmulatedFault fault) {
  auto sc = src.contiguous();
  const int64_t n = sc.size(0), d = sc.size(1), T = rows.numel() / k;
  auto out = torch::full({T, d}, NAN, sc.options());
  if (T == 0 || d == 0) return out;
  const auto l = layout_for(d, sc.element_size(), {sc.data_ptr(), out.data_ptr()});
  const int64_t* rw = rows.data_ptr<int64_t>();
  const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
  const int64_t kk = kernel_k(k, fault);
  tr::with_row_dtype(sc.scalar_type(), "sum_rows", [&](auto tag) {
    using T_ = decltype(tag);
    tr::with_row_shape<T_>(kk, l.vec, [&](auto K, auto V) {
      const T_* sp = sc.data_ptr<T_>();
      T_* op = out.data_ptr<T_>();
      at::parallel_for(0, T, 64, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          for (int lane = 0; lane < running_lanes(l, fault); ++lane) {
            tr::sum_rows_lane<decltype(K)::value, decltype(V)::value>(
                sp, n, rw + t * k, wp != nullptr ? wp + t * k : nullptr, kk, l, lane, op + t * d);
          }
        }
      });
    });
  });
  return out;
}
}  // namespace

torch::Tensor permute_backward(const torch::Tensor& grad_out, const torch::Tensor& rows, int64_t k,
                               EmulatedFault fault) {
  return sum_rows(grad_out, rows, torch::Tensor(), k, fault);
}

torch::Tensor combine_forward(const torch::Tensor& y, const torch::Tensor& rows,
                              const torch::Tensor& weights, EmulatedFault fault) {
  return sum_rows(y, rows, weights.contiguous(), weights.size(1), fault);
}

std::pair<torch::Tensor, torch::Tensor> combine_backward(const torch::Tensor& grad_out,
                                                         const torch::Tensor& y,
                                                         const torch::Tensor& rows,
                                                         const torch::Tensor& weights,
                                                         EmulatedFault fault) {
  auto go = grad_out.contiguous();
  auto yc = y.contiguous();
  auto w = weights.contiguous();
  const int64_t n = yc.size(0), d = yc.size(1), T = w.size(0), k = w.size(1);
  auto grad_y = torch::full_like(yc, NAN);
  auto grad_w = torch::full(w.sizes(), NAN, w.options());
  if (T == 0) return {grad_y, grad_w};
  if (d == 0) return {grad_y, grad_w.zero_()};
  const auto l =
      layout_for(d, yc.element_size(), {go.data_ptr(), yc.data_ptr(), grad_y.data_ptr()});
  const int levels =
      tr::reduce_levels(l.lanes) - (fault == EmulatedFault::kShortReduction && l.lanes > 1 ? 1 : 0);
  const int64_t* rw = rows.data_ptr<int64_t>();
  const float* wp = w.data_ptr<float>();
  float* gw = grad_w.data_ptr<float>();
  const int64_t kk = kernel_k(k, fault);
  tr::with_row_dtype(yc.scalar_type(), "combine backward", [&](auto tag) {
    using T_ = decltype(tag);
    tr::with_row_shape<T_>(kk, l.vec, [&](auto K, auto V) {
      constexpr int kK = decltype(K)::value;
      constexpr int kSlots = tr::Chunk<kK>::kSlots;
      const T_* gp = go.data_ptr<T_>();
      const T_* yp = yc.data_ptr<T_>();
      T_* gy = grad_y.data_ptr<T_>();
      at::parallel_for(0, T, 16, [&](int64_t b, int64_t e) {
        std::vector<std::array<float, kSlots>> dots(static_cast<size_t>(l.lanes));
        for (int64_t t = b; t < e; ++t) {
          for (int64_t j0 = 0; j0 < (kK > 0 ? kK : kk); j0 += tr::chunk_step<kK>()) {
            const auto c = tr::load_chunk<kK>(rw + t * k, wp + t * k, j0, kk, n);
            for (auto& lane_dots : dots) lane_dots.fill(0.f);  // lanes that do not run add 0
            for (int lane = 0; lane < running_lanes(l, fault); ++lane) {
              float lane_dots[kSlots];
              tr::combine_backward_lane<kK, decltype(V)::value>(gp + t * d, yp, c, l, lane, gy,
                                                                lane_dots);
              std::copy(lane_dots, lane_dots + kSlots, dots[static_cast<size_t>(lane)].begin());
            }
            // The kernel's xor butterfly: lane i adds lane i ^ offset, offsets lanes/2 .. 1.
            for (int level = 0; level < levels; ++level) {
              const int offset = l.lanes >> (level + 1);
              auto before = dots;
              for (int lane = 0; lane < l.lanes; ++lane) {
                for (int jj = 0; jj < kSlots; ++jj) {
                  dots[static_cast<size_t>(lane)][static_cast<size_t>(jj)] +=
                      before[static_cast<size_t>(lane ^ offset)][static_cast<size_t>(jj)];
                }
              }
            }
            for (int jj = 0; jj < kSlots; ++jj) {
              const int64_t j = j0 + jj;
              if (kK > 0 || j < kk)
                gw[t * k + j] = c.kept[jj] ? dots[0][static_cast<size_t>(jj)] : 0.f;
            }
          }
        }
      });
    });
  });
  // With kLastAssignmentSkipped the kernel never wrote the last column of grad_w.
  return {grad_y, grad_w};
}

PermuteOutputs permute_all(const PermuteInputs& in, EmulatedFault fault) {
  PermuteOutputs out;
  out.rows_of_assignment = assignment_rows(in.source_assignment, in.tokens * in.k);
  const int64_t N = in.source_token.numel();
  out.permuted = permute_forward(in.x, out.rows_of_assignment, in.k, N, fault);
  out.grad_x = permute_backward(in.grad_permuted, out.rows_of_assignment, in.k, fault);
  out.combined = combine_forward(in.y, out.rows_of_assignment, in.weights, fault);
  auto [gy, gw] = combine_backward(in.grad_out, in.y, out.rows_of_assignment, in.weights, fault);
  out.grad_y = gy;
  out.grad_w = gw;
  return out;
}

}  // namespace moe::kernel_emulation
