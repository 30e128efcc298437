#include "moe/parallel/zero.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "moe/optim/gradient_clipping.h"
#include "moe/parallel/buckets.h"
#include "moe/parallel/process_group.h"

namespace moe::parallel {

using optim::AdamWState;
using optim::scale_by_clip_coefficient;

ZeroPartition::ZeroPartition(parallel::ProcessGroup& group, int64_t stage,
                             std::vector<std::string> names, std::vector<torch::Tensor> params,
                             int64_t reduce_bytes, int64_t broadcast_bytes, int64_t subgroup)
    : group_(group),
      gid_(subgroup),
      stage_(stage),
      reduce_bytes_(reduce_bytes),
      broadcast_bytes_(broadcast_bytes),
      names_(std::move(names)),
      params_(std::move(params)),
      owner_(params_.size(), 0) {
  // Largest first onto the least-loaded rank: deterministic, so every rank computes the same.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(group.group_size(subgroup)), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = static_cast<int64_t>(r);
    load[r] += params_[i].numel();
  }
}

int64_t ZeroPartition::rank() const { return group_.group_rank(gid_); }
int64_t ZeroPartition::size() const { return group_.group_size(gid_); }

bool ZeroPartition::holds(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

bool ZeroPartition::owns(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return owner_[i] == rank();
  }
  return false;
}

int64_t ZeroPartition::owned_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] == rank()) n += params_[i].numel();
  }
  return n;
}

void ZeroPartition::drop_foreign_gradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != rank()) params_[i].mutable_grad() = torch::Tensor();
  }
}

namespace {
// Calls back when autograd has accumulated a parameter's gradient (its AccumulateGrad node).
struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  explicit GradReadyHook(std::function<void()> f) : f_(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { f_(); }
  std::function<void()> f_;
};
constexpr size_t kMaxInFlight = 2;  // launched buckets not yet waited for
}  // namespace

void ZeroPartition::reduce_in_backward() {
  if (size() < 2 || stage_ < 2) return;
  std::vector<int64_t> bytes;  // reverse model order
  for (size_t k = params_.size(); k-- > 0;)
    bytes.push_back(static_cast<int64_t>(params_[k].nbytes()));
  bucket_of_.assign(params_.size(), 0);
  for (auto& bucket : parallel::pack_buckets(bytes, reduce_bytes_)) {
    for (size_t& i : bucket) {
      i = params_.size() - 1 - i;  // back to parameter indices
      bucket_of_[i] = buckets_.size();
    }
    buckets_.push_back(std::move(bucket));
  }
  rearm();
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[k], std::make_unique<GradReadyHook>([this, k] { grad_ready(k); }));
  }
}

void ZeroPartition::grad_ready(size_t param) {
  --waiting_[bucket_of_[param]];
  while (next_bucket_ < buckets_.size() && waiting_[next_bucket_] == 0) launch(next_bucket_++);
}

void ZeroPartition::launch(size_t bucket) {
  while (in_flight_.size() >= kMaxInFlight) {
    for (auto& l : in_flight_.front()) complete(l);
    in_flight_.erase(in_flight_.begin());
  }
  torch::NoGradGuard no_grad;
  std::vector<Launched> launched;
  for (int64_t owner = 0; owner < size(); ++owner) {
    Launched l{owner, {}, {}, {}};
    std::vector<torch::Tensor> parts;
    for (size_t k : buckets_[bucket]) {
      if (owner_[k] != owner) continue;
      l.params.push_back(k);
      const auto& g = params_[k].grad();
      // A parameter without a gradient in this backward still takes part (zeros): every rank
      // must reduce the same sizes.
      parts.push_back(g.defined() ? g.reshape({-1})
                                  : torch::zeros({params_[k].numel()}, params_[k].options()));
      if (owner != rank()) params_[k].mutable_grad() = torch::Tensor();  // ours no more
    }
    if (l.params.empty()) continue;
    l.flat = torch::cat(parts);
    l.wait = group_.reduce_sum_async(l.flat, owner, gid_);
    launched.push_back(std::move(l));
  }
  in_flight_.push_back(std::move(launched));
}

void ZeroPartition::complete(Launched& l) {
  l.wait();
  if (l.owner != rank()) return;
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t k : l.params) {
    auto& p = params_[k];
    auto sum = l.flat.narrow(0, offset, p.numel()).view_as(p);
    if (p.grad().defined()) {
      p.mutable_grad().copy_(sum);
    } else {
      p.mutable_grad() = sum.clone();
    }
    offset += p.numel();
  }
}

void ZeroPartition::finish_backward() {
  if (buckets_.empty()) return;
  while (next_bucket_ < buckets_.size()) launch(next_bucket_++);  // gradients that never came
  for (auto& launched : in_flight_) {
    for (auto& l : launched) complete(l);
  }
  in_flight_.clear();
  rearm();
}

void ZeroPartition::rearm() {
  next_bucket_ = 0;
  waiting_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    waiting_[b] = static_cast<int64_t>(buckets_[b].size());
}

void ZeroPartition::average_owned() {
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / static_cast<double>(size());
  for (size_t k = 0; k < params_.size(); ++k) {
    if (owner_[k] == rank() && params_[k].grad().defined()) params_[k].mutable_grad().mul_(inv);
  }
}

torch::Tensor ZeroPartition::clip_global(const std::vector<torch::Tensor>& own_grads,
                                         double max_norm) {
  auto sq = torch::zeros({1}, torch::kDouble);
  if (!own_grads.empty()) {
    sq += at::stack(at::_foreach_norm(own_grads, 2)).to(torch::kDouble).square().sum().cpu();
  }
  group_.allreduce_sum(sq, gid_);
  auto norm = sq.sqrt().to(torch::kFloat).squeeze();
  scale_by_clip_coefficient(own_grads, norm, max_norm);
  return norm;
}

void ZeroPartition::broadcast_updates() {
  torch::NoGradGuard no_grad;
  for (int64_t root = 0; root < size(); ++root) {
    // The root's parameters in buckets of at most broadcast_bytes_.
    std::vector<size_t> mine;
    std::vector<int64_t> bytes;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != root) continue;
      mine.push_back(i);
      bytes.push_back(static_cast<int64_t>(params_[i].nbytes()));
    }
    for (const auto& bucket : parallel::pack_buckets(bytes, broadcast_bytes_)) {
      std::vector<torch::Tensor> parts, members;
      for (size_t k : bucket) {
        members.push_back(params_[mine[k]].detach());
        parts.push_back(members.back().reshape({-1}));
      }
      auto flat = torch::cat(parts);
      group_.broadcast(flat, root, gid_);
      parallel::copy_from_flat(flat, members);
    }
  }
}

OptimizerStream ZeroPartition::optimizer_stream(FusedAdamW& mine) {
  std::map<std::string, AdamWState*> own;
  for (auto& [name, st] : mine.named_state()) own[name] = st;
  OptimizerStream s;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto shape = params_[i].sizes().vec();
    const auto bytes = static_cast<size_t>(params_[i].numel()) * sizeof(float);
    s.layout.push_back({names_[i] + ".exp_avg", "F32", shape, nullptr, bytes});
    s.layout.push_back({names_[i] + ".exp_avg_sq", "F32", shape, nullptr, bytes});
    s.layout.push_back({names_[i] + ".step", "F32", {}, nullptr, sizeof(float)});
  }
  s.each = [this, own](const OptimizerStream::Sink& sink) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const bool owner = owner_[i] == rank();
      const AdamWState* src = owner ? own.at(names_[i]) : nullptr;
      for (int which = 0; which < 3; ++which) {
        torch::Tensor buf;
        if (owner) {
          const torch::Tensor& t = which == 0   ? src->exp_avg
                                   : which == 1 ? src->exp_avg_sq
                                                : src->step;
          buf = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
        } else {
          buf = which == 2 ? torch::empty({}, torch::kFloat)
                           : torch::empty(params_[i].sizes(), torch::kFloat);
        }
        group_.broadcast(buf, owner_[i], gid_);
        sink(buf);
      }  // buf is released here: one state tensor in flight
    }
  };
  return s;
}

}  // namespace moe::parallel
