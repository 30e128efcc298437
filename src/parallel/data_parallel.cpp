#include "moe/parallel/data_parallel.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "moe/config/architecture.h"
#include "moe/config/parallel_dims.h"
#include "moe/optim/gradient_clipping.h"
#include "moe/parallel/process_group.h"
#include "moe/parallel/step_result.h"
#include "moe/parallel/zero.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"

namespace moe::parallel {

using checkpoint::local_optimizer_stream;
using optim::clip_divisor;
using optim::gradient_norm;
using optim::scale_by_clip_coefficient;

namespace fs = std::filesystem;
using config::GradientReduction;
using nlohmann::json;

// ---- a world of one: the base class's local computations ----

void DataParallel::begin_step(model::TransformerLM& model, FusedAdamW& optimizer) {
  optimizer.zero_grad();
}

void DataParallel::backward(const torch::Tensor& scaled_loss, bool last) { scaled_loss.backward(); }

Clipping DataParallel::clip(const std::vector<torch::Tensor>& grads, double max_norm) {
  if (grads.empty()) return {};
  const torch::Tensor norm = gradient_norm(grads);
  return {norm.item<double>(), clip_divisor(norm, max_norm)};
}

void DataParallel::checkpoint(FusedAdamW& optimizer,
                              const std::function<void(const OptimizerStream*)>& write) {
  write(nullptr);
}

namespace {

class LocalTraining final : public DataParallel {};

// Test hook (tests/parallel/expert_parallel_test.py): this rank dies in its N-th all-to-all, while
// the others wait in theirs.
void die_here_for_tests() {
  static int64_t calls = 0;
  if (++calls == fault_injection().die_in_all_to_all) std::raise(SIGKILL);
}

// ---- world > 1 ----

// The parameters whose gradients take part in the reduction (LoRA: the adapters only).
std::vector<torch::Tensor> trainable(model::TransformerLM& model) {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : layers::trainable_parameters(*model)) out.push_back(p);
  return out;
}

class RankGroup final : public DataParallel {
 public:
  RankGroup(const config::Config& cfg, std::unique_ptr<parallel::ProcessGroup> group,
            const config::DataParallelMode& mode)
      : cfg_(cfg), group_(std::move(group)), mode_(mode) {
    if (mode_.expert_parallel > 1) make_expert_groups();
  }

  int64_t rank() const override { return group_->rank(); }
  int64_t size() const override { return group_->size(); }
  moe::MoeParallel moe_parallel() override {
    parallel::ProcessGroup* g = group_.get();
    moe::MoeParallel p;
    p.loads = {[g](at::Tensor& t) { g->allreduce_sum(t); }, g->size(),
               [g](const at::Tensor& t) { return g->all_gather_rows(t); }, g->rank()};
    if (mode_.expert_parallel > 1) {
      p.ep = {mode_.expert_parallel, g->group_rank(ep_group_),
              [g, id = ep_group_](const torch::Tensor& rows, const std::vector<int64_t>& send,
                                  const std::vector<int64_t>& recv) {
                die_here_for_tests();
                return g->all_to_all(rows, send, recv, id);
              }};
    }
    return p;
  }

  void attach(model::TransformerLM& model) override {
    for (auto& [name, p] : layers::trainable_parameters(*model)) {
      if (model->expert_rows(name)) expert_params_.emplace_back(name, p);
    }
    if (!mode_.shards_optimizer()) return;
    // With expert parallelism the experts a rank holds are shared out over their replicas (its
    // expert-data-parallel group), the rest over the world.
    std::vector<std::string> names, expert_names;
    std::vector<torch::Tensor> params, experts;
    for (auto& [name, p] : layers::trainable_parameters(*model)) {
      const bool expert = model->expert_rows(name).has_value();
      (expert ? expert_names : names).push_back(name);
      (expert ? experts : params).push_back(p);
    }
    const int64_t reduce = config::reduce_bucket_bytes(cfg_);
    const int64_t broadcast = config::allgather_bucket_bytes(cfg_);
    zero_ = std::make_unique<ZeroPartition>(*group_, mode_.zero_stage, std::move(names),
                                            std::move(params), reduce, broadcast);
    if (!expert_names.empty()) {
      zero_experts_ =
          std::make_unique<ZeroPartition>(*group_, mode_.zero_stage, std::move(expert_names),
                                          std::move(experts), reduce, broadcast, expert_dp_group_);
    }
  }
  bool updates(const std::string& name) const override {
    if (!zero_) return true;
    return zero_experts_ && zero_experts_->holds(name) ? zero_experts_->owns(name)
                                                       : zero_->owns(name);
  }
  bool optimizer_is_share() const override { return zero_ != nullptr; }

  void agree_on_resume(int64_t step, const std::string& checkpoint,
                       const std::string& store_root) override {
    const std::string mine =
        std::to_string(step) + " " +
        (checkpoint.empty() ? "(fresh start)" : fs::path(checkpoint).filename().string());
    const auto all = group_->allgather_text("resume", mine);
    if (std::all_of(all.begin(), all.end(), [&](const std::string& s) { return s == all[0]; })) {
      return;
    }
    std::string each;
    for (size_t r = 0; r < all.size(); ++r) {
      const auto sp = all[r].find(' ');
      each += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + " at step " +
              all[r].substr(0, sp) + " from " + all[r].substr(sp + 1);
    }
    throw UserError("distributed: ranks would resume from different checkpoints (" + each +
                    ") under " + store_root +
                    "; training.output_dir must be one shared directory (or identical copies) on "
                    "every node (docs/distributed.md)");
  }

  void start(model::TransformerLM& model) override {
    switch (mode_.reduction) {
      case GradientReduction::kReduceToOwnersInBackward:
        zero_->reduce_in_backward();
        break;
      case GradientReduction::kReducerInBackward:
        group_->enable_gradient_sync(trainable(model), config::reduce_bucket_bytes(cfg_));
        break;
      case GradientReduction::kAllReduceAfterBackward:
      case GradientReduction::kNone:
        break;
    }
  }
  void set_step(int64_t step) override { group_->set_step(step); }

  StopInputs agree(const StopInputs& mine) override {
    const bool r0 = writes();
    auto v = torch::tensor({r0 ? mine.minutes_since_save : 0.0, r0 ? mine.run_minutes : 0.0,
                            mine.signal != 0 ? 1.0 : 0.0, mine.checkpoint_request ? 1.0 : 0.0},
                           torch::kDouble);
    group_->allreduce_sum(v);
    StopInputs a = mine;
    a.minutes_since_save = v[0].item<double>();
    a.run_minutes = v[1].item<double>();
    if (a.signal == 0 && v[2].item<double>() > 0) a.signal = SIGTERM;  // another rank's
    a.checkpoint_request = v[3].item<double>() > 0;
    return a;
  }
  void barrier() override { group_->barrier(); }

  void begin_step(model::TransformerLM& model, FusedAdamW& optimizer) override {
    optimizer.zero_grad();
    if (zero_) {  // the optimizer holds our share: release every gradient
      for (auto& p : trainable(model)) p.mutable_grad() = torch::Tensor();
    }
  }

  void backward(const torch::Tensor& scaled_loss, bool last) override {
    switch (mode_.reduction) {
      case GradientReduction::kReduceToOwnersInBackward:  // every backward sums onto owners
        group_->guard("gradient reduce (in the backward)", [&] {
          scaled_loss.backward();
          zero_->finish_backward();
        });
        return;
      case GradientReduction::kReducerInBackward:  // the last backward all-reduces in buckets
        if (last) {
          group_->prepare_gradient_sync(scaled_loss);
          group_->guard("gradient all-reduce (in the backward)", [&] { scaled_loss.backward(); });
          return;
        }
        break;
      case GradientReduction::kAllReduceAfterBackward:
      case GradientReduction::kNone:
        break;
    }
    if (mode_.expert_parallel > 1) {  // the experts' all-to-all runs inside the backward
      group_->guard("backward (expert all-to-all)", [&] { scaled_loss.backward(); });
      return;
    }
    scaled_loss.backward();
  }

  // Every rank ends the step with the mean gradient over all ranks' micro-batches (the gradient
  // of the global batch's mean loss: every rank has the same token count), the mean losses and
  // the summed expert loads, so every rank takes the same decisions.
  void finish_gradients(model::TransformerLM& model, StepResult& r) override {
    if (mode_.reduction == GradientReduction::kReduceToOwnersInBackward) {
      zero_->average_owned();  // summed onto the owners during the backwards
    } else if (mode_.reduction == GradientReduction::kAllReduceAfterBackward) {
      std::vector<torch::Tensor> grads, expert_grads;
      for (auto& [name, p] : layers::trainable_parameters(*model)) {
        // A parameter without a gradient on this rank still takes part: the buckets must match.
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        (model->expert_rows(name) ? expert_grads : grads).push_back(p.grad());
      }
      group_->allreduce_mean(grads, config::reduce_bucket_bytes(cfg_));
      // An expert's gradient already sums its EP group's tokens (the all-to-all's backward):
      // summed over the replicas of the expert and divided by the world, it is the mean.
      if (!expert_grads.empty()) {
        group_->allreduce_scaled(expert_grads, config::reduce_bucket_bytes(cfg_),
                                 1.0 / static_cast<double>(group_->size()), expert_dp_group_);
      }
    }
    combine_figures(r);
    if (mode_.shards_gradients()) {  // keep our own only
      zero_->drop_foreign_gradients();
      if (zero_experts_) zero_experts_->drop_foreign_gradients();
    }
  }

  void agree_on_overflow(torch::Tensor& found_inf) override {
    if (mode_.shards_gradients() || mode_.expert_parallel > 1) group_->allreduce_sum(found_inf);
  }

  Clipping clip(const std::vector<torch::Tensor>& grads, double max_norm) override {
    // One rank holds every gradient: the local arithmetic (torch's clip_grad_norm_), so that a
    // group of one is the identity. ZeRO's double-precision sum of squares is the same norm but
    // can round to a neighbouring float (seen on an AMD EPYC: last-bit differences from step 1).
    if (mode_.world_size == 1) return DataParallel::clip(grads, max_norm);
    if (mode_.shards_gradients()) return {zero_->clip_global(grads, max_norm).item<double>(), {}};
    if (mode_.expert_parallel > 1) return {clip_expert_parallel(grads, max_norm), {}};
    return DataParallel::clip(grads, max_norm);
  }

  void after_update() override {
    if (zero_) zero_->broadcast_updates();                  // owners -> everyone
    if (zero_experts_) zero_experts_->broadcast_updates();  // owners -> the replicas
  }

  // ZeRO: every owner's state streams to rank 0 one tensor at a time while rank 0 writes it.
  // Then the others wait for rank 0, so that no rank runs ahead of a stop.
  void checkpoint(FusedAdamW& optimizer,
                  const std::function<void(const OptimizerStream*)>& write) override {
    if (mode_.expert_parallel > 1) {
      checkpoint_expert_parallel(optimizer, write);
    } else if (zero_) {
      const OptimizerStream stream = zero_->optimizer_stream(optimizer);
      if (writes()) {
        write(&stream);
      } else {
        stream.each([](const at::Tensor&) {});
      }
    } else if (writes()) {
      write(nullptr);
    }
    group_->barrier();
  }

 private:
  // The EP groups (ranks [k * EP, (k + 1) * EP): between them, every expert) and the expert-data-
  // parallel groups (ranks equal mod EP: the replicas of the same experts). Every rank creates
  // its two in the same order, so no rendezvous waits on another.
  void make_expert_groups() {
    const config::ParallelDims dims =
        config::parallel_dims(group_->size(), group_->rank(), mode_.expert_parallel);
    ep_group_ = group_->new_group(dims.ep_group());
    expert_dp_group_ = group_->new_group(dims.expert_replicas());
  }

  // The global norm: the other gradients are the same on every rank after the reduction, the
  // experts' differ across the EP group (each rank holds its own experts): their squares are
  // summed over it.
  double clip_expert_parallel(const std::vector<torch::Tensor>& grads, double max_norm) {
    std::set<const void*> experts;
    for (auto& [name, p] : expert_params_) {
      if (p.grad().defined()) experts.insert(p.grad().data_ptr());
    }
    std::vector<torch::Tensor> mine, theirs;
    for (const auto& g : grads) (experts.count(g.data_ptr()) ? theirs : mine).push_back(g);
    auto squares = [](const std::vector<torch::Tensor>& v) {
      return v.empty() ? torch::zeros({1}, torch::kDouble)
                       : at::stack(at::_foreach_norm(v, 2))
                             .to(torch::kDouble)
                             .square()
                             .sum()
                             .reshape({1})
                             .cpu();
    };
    auto expert_sq = squares(theirs);
    group_->allreduce_sum(expert_sq, ep_group_);
    // Rank 0's norm everywhere: each EP group sums its squares itself, and with more than two
    // ranks NCCL may add them in another order (an ulp apart: replicas would drift).
    auto total = (squares(mine) + expert_sq).sqrt();
    group_->broadcast(total, 0);
    const auto norm = total.to(torch::kFloat).squeeze();
    scale_by_clip_coefficient(grads, norm, max_norm);
    return norm.item<double>();
  }

  // The single-process layout at any EP: the experts' weights gathered over the EP group before
  // the write (every EP group gathers its own; rank 0's writes), their Adam moments gathered
  // one tensor at a time while rank 0 writes them.
  void checkpoint_expert_parallel(FusedAdamW& optimizer,
                                  const std::function<void(const OptimizerStream*)>& write) {
    torch::NoGradGuard no_grad;
    const int64_t ep = mode_.expert_parallel;
    // Rank 0's EP group gathers; the others only take part in ZeRO's broadcasts among replicas.
    const bool gathers = group_->rank() < ep;
    auto whole = std::make_shared<std::map<std::string, torch::Tensor>>();
    for (auto& [name, p] : expert_params_) {
      if (gathers) (*whole)[name] = group_->all_gather_rows(p.detach(), ep_group_).to(torch::kCPU);
    }
    const OptimizerStream local =
        zero_ ? zero_streams(optimizer) : local_optimizer_stream(optimizer);
    OptimizerStream s = local;
    std::vector<bool> gathered;
    for (auto& entry : s.layout) {
      const bool expert =
          entry.name.find(".moe.experts.") != std::string::npos && !entry.shape.empty();
      if (expert) entry.shape[0] *= ep, entry.nbytes *= static_cast<size_t>(ep);
      gathered.push_back(expert);
    }
    parallel::ProcessGroup* g = group_.get();
    s.each = [local, gathered, gathers, g, id = ep_group_](const OptimizerStream::Sink& sink) {
      size_t i = 0;
      local.each([&](const at::Tensor& t) {
        sink(gathered[i++] && gathers ? g->all_gather_rows(t.detach(), id) : t);
      });
    };
    s.whole_parameter = [whole](const std::string& name) {
      const auto it = whole->find(name);
      return it == whole->end() ? torch::Tensor() : it->second;
    };
    if (writes()) {
      write(&s);
    } else {
      s.each([](const at::Tensor&) {});
    }
  }

  // ZeRO with expert parallelism: the world's owners' states, then the experts' (each from its
  // owner among the replicas; the caller gathers them over the EP group).
  OptimizerStream zero_streams(FusedAdamW& optimizer) {
    OptimizerStream dense = zero_->optimizer_stream(optimizer);
    if (!zero_experts_) return dense;
    OptimizerStream experts = zero_experts_->optimizer_stream(optimizer);
    OptimizerStream both = dense;
    both.layout.insert(both.layout.end(), experts.layout.begin(), experts.layout.end());
    both.each = [dense, experts](const OptimizerStream::Sink& sink) {
      dense.each(sink);
      experts.each(sink);
    };
    return both;
  }

  // One collective: the loss figures (averaged), the expert loads, drops and target tokens
  // (summed).
  void combine_figures(StepResult& r) {
    std::vector<torch::Tensor> parts = {
        torch::tensor({r.lm_sum, r.aux_sum, r.z_sum}, torch::kDouble)};
    for (auto& t : r.tokens_per_expert) parts.push_back(t.to(torch::kCPU, torch::kDouble));
    parts.push_back(torch::tensor(
        {static_cast<double>(r.dropped), static_cast<double>(r.target_tokens)}, torch::kDouble));
    auto flat = torch::cat(parts);
    group_->allreduce_sum(flat);
    const double inv = 1.0 / static_cast<double>(group_->size());
    r.lm_sum = flat[0].item<double>() * inv, r.aux_sum = flat[1].item<double>() * inv;
    r.z_sum = flat[2].item<double>() * inv;
    int64_t offset = 3;
    for (auto& t : r.tokens_per_expert) {
      t = flat.narrow(0, offset, t.numel()).to(t.device(), torch::kLong);
      offset += t.numel();
    }
    r.dropped = static_cast<int64_t>(flat[offset].item<double>());
    r.target_tokens = static_cast<int64_t>(flat[offset + 1].item<double>());
  }

  const config::Config& cfg_;
  std::unique_ptr<parallel::ProcessGroup> group_;
  config::DataParallelMode mode_;
  std::unique_ptr<ZeroPartition> zero_;  // ZeRO stage 1/2; null at stage 0
  // ZeRO with expert parallelism: the experts' partition over their replicas.
  std::unique_ptr<ZeroPartition> zero_experts_;
  // Expert parallelism (mode_.expert_parallel > 1): the groups' ids in group_, and the routed
  // experts' parameters this rank holds a share of.
  int64_t ep_group_ = parallel::ProcessGroup::kWorld,
          expert_dp_group_ = parallel::ProcessGroup::kWorld;
  std::vector<std::pair<std::string, torch::Tensor>> expert_params_;
};

}  // namespace

std::unique_ptr<DataParallel> DataParallel::create(const config::Config& cfg,
                                                   const parallel::LaunchEnv& env, bool cuda,
                                                   spdlog::logger& log) {
  if (env.world_size <= 1) return std::make_unique<LocalTraining>();
  if (env.rank > 0) {
    log.set_level(std::min(log.level(), spdlog::level::warn) == spdlog::level::off
                      ? spdlog::level::off
                      : spdlog::level::warn);
    log.set_pattern("[%Y-%m-%d %H:%M:%S] [rank " + std::to_string(env.rank) + "] %l %v");
  }
  config::DistBackend backend = cfg.distributed.backend;
  if (backend == config::DistBackend::kAuto) {
    backend = cuda ? config::DistBackend::kNccl : config::DistBackend::kGloo;
  }
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed.timeout_s * 1000));
  auto group = std::make_unique<parallel::ProcessGroup>(env, backend, timeout);
  const std::string mine = config::to_json(cfg).dump();
  const auto all = group->allgather_text("config", mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::string key = config::first_difference(json::parse(all[0]), json::parse(all[r]));
    throw UserError("distributed: rank " + std::to_string(r) +
                    " resolved another config than rank 0 (" + key +
                    "); every rank must run the same config and --set values");
  }
  log.info("data parallel: rank {} of {} ({}, {}), master {}:{}", env.rank, env.world_size,
           config::name(backend), env.launcher, env.master_addr, env.master_port);
  return over(cfg, std::move(group), config::data_parallel_mode(cfg, env.world_size));
}

std::unique_ptr<DataParallel> DataParallel::over(const config::Config& cfg,
                                                 std::unique_ptr<parallel::ProcessGroup> group,
                                                 const config::DataParallelMode& mode) {
  return std::make_unique<RankGroup>(cfg, std::move(group), mode);
}

}  // namespace moe::parallel
