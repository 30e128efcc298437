// Gloo's and NCCL's c10d headers are compiled with USE_C10D_GLOO / USE_C10D_NCCL (set for this
// file in src/CMakeLists.txt). The pip wheel ships LibTorch's c10d headers and its bundled Gloo
// library but not Gloo's headers: Debian's libgloo-dev provides them (only smart-pointer types
// of Gloo cross this boundary, so its version does not change any layout we use).
#include "moe/parallel/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef MOE_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include "moe/parallel/buckets.h"
#include "moe/util/errors.h"

namespace moe::parallel {

namespace {
constexpr auto kBeatEvery = std::chrono::milliseconds(500);
constexpr auto kBeatWatch = std::chrono::milliseconds(2500);  // > 4 beats: a live rank beats
std::string beat_key(int64_t rank) { return "moe-train/heartbeat/" + std::to_string(rank); }
}  // namespace

// Each rank publishes "COUNT STEP" under its heartbeat key every kBeatEvery, from a thread with
// its own store connection (the main thread may be blocked in a store wait). A rank that is dead
// or stopped stops counting; after a failed collective the survivors read the counters twice
// and name the ranks that did not move (or are at an earlier step). Counters, not clocks: the
// nodes' clocks need not agree.
class Heartbeat {
 public:
  Heartbeat(const LaunchEnv& env, std::chrono::milliseconds timeout) : rank_(env.rank) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = false;
    so.waitWorkers = false;
    // Short: a beat stuck on a hung store host must not hold up this rank's exit for a whole
    // distributed.timeout_s when the group is torn down.
    so.timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5));
    store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    thread_ = std::thread([this] { run(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void set_step(int64_t step) { step_.store(step); }
  int64_t step() const { return step_.load(); }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (int64_t count = 0; !stop_; ++count) {
      const std::string v = std::to_string(count) + " " + std::to_string(step_.load());
      try {
        store_->set(beat_key(rank_), std::vector<uint8_t>(v.begin(), v.end()));
      } catch (const std::exception&) {
        return;  // the store is gone (its host died): nothing left to tell
      }
      cv_.wait_for(lock, kBeatEvery, [this] { return stop_; });
    }
  }
  int64_t rank_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct ProcessGroup::Impl {
  struct Group {
    c10::intrusive_ptr<c10d::Backend> backend;  // null for a group of one
    int64_t rank = 0, size = 1;
  };
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::vector<Group> groups;                     // [kWorld] = the world
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // the backend behind c10d's front end
  std::shared_ptr<c10d::Reducer> reducer;
  std::unique_ptr<Heartbeat> heartbeat;
};

ProcessGroup::ProcessGroup(const LaunchEnv& env, config::DistBackend backend,
                           std::chrono::milliseconds timeout)
    : env_(env), backend_(backend), impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0 && !env.agent_store;
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw TrainingError("distributed: rank " + std::to_string(env.rank) +
                        ": no rendezvous with the other ranks at " + env.master_addr + ":" +
                        std::to_string(env.master_port) + " within " +
                        std::to_string(timeout.count() / 1000) + " s (distributed.timeout_s)");
  }
  if (backend == config::DistBackend::kGloo) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    impl_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
        impl_->store, static_cast<int>(env.rank), static_cast<int>(env.world_size), opts);
  } else if (backend == config::DistBackend::kNccl) {
#ifdef MOE_HAVE_NCCL
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));  // one GPU per rank
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    impl_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        impl_->store, static_cast<int>(env.rank), static_cast<int>(env.world_size), opts);
#else
    throw UserError("distributed.backend = nccl: this build has no CUDA/NCCL");
#endif
  } else {
    throw UserError("distributed.backend = auto: resolve it to gloo or nccl first");
  }
  impl_->groups.push_back({impl_->backend, env.rank, env.world_size});
  timeout_ = timeout;
  impl_->heartbeat = std::make_unique<Heartbeat>(env, timeout);
}

int64_t ProcessGroup::new_group(const std::vector<int64_t>& ranks) {
  const auto at = std::find(ranks.begin(), ranks.end(), env_.rank);
  TORCH_CHECK(at != ranks.end(), "new_group: rank ", env_.rank, " is not in the group");
  Impl::Group g{nullptr, at - ranks.begin(), static_cast<int64_t>(ranks.size())};
  if (g.size > 1) {
    std::string name = "moe-train/group";
    for (int64_t r : ranks) name += "/" + std::to_string(r);
    auto store = c10::make_intrusive<c10d::PrefixStore>(name, impl_->store);
    collective("subgroup rendezvous", [&] {
      if (backend_ == config::DistBackend::kGloo) {
        auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        g.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(g.rank),
                                                                static_cast<int>(g.size), opts);
      } else {
#ifdef MOE_HAVE_NCCL
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = timeout_;
        g.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(g.rank),
                                                                static_cast<int>(g.size), opts);
#endif
      }
    });
  }
  impl_->groups.push_back(g);
  return static_cast<int64_t>(impl_->groups.size()) - 1;
}

int64_t ProcessGroup::group_size(int64_t group) const {
  return impl_->groups.at(static_cast<size_t>(group)).size;
}
int64_t ProcessGroup::group_rank(int64_t group) const {
  return impl_->groups.at(static_cast<size_t>(group)).rank;
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::set_step(int64_t step) { impl_->heartbeat->set_step(step); }

// Which ranks did not arrive: those whose heartbeat stood still over kBeatWatch (dead or hung),
// and those still at an earlier step than this rank. Empty when every rank looks live and level.
std::string ProcessGroup::missing_ranks() const {
  auto read_all = [&] {
    std::vector<std::pair<int64_t, int64_t>> beats(static_cast<size_t>(env_.world_size), {-1, -1});
    for (int64_t r = 0; r < env_.world_size; ++r) {
      if (!impl_->store->check({beat_key(r)})) continue;
      const auto v = impl_->store->get(beat_key(r));
      std::istringstream in(std::string(v.begin(), v.end()));
      in >> beats[static_cast<size_t>(r)].first >> beats[static_cast<size_t>(r)].second;
    }
    return beats;
  };
  try {
    const auto before = read_all();
    std::this_thread::sleep_for(kBeatWatch);
    const auto after = read_all();
    const int64_t mine = impl_->heartbeat->step();
    std::string out;
    for (int64_t r = 0; r < env_.world_size; ++r) {
      if (r == env_.rank) continue;
      const auto& [c0, s0] = before[static_cast<size_t>(r)];
      const auto& [c1, s1] = after[static_cast<size_t>(r)];
      std::string why;
      if (c1 < 0) {
        why = "never checked in";
      } else if (c1 == c0) {
        why = "no heartbeat for " + std::to_string(kBeatWatch.count() / 1000.0).substr(0, 3) +
              " s: dead or hung, last seen at step " + std::to_string(s1);
      } else if (s1 < mine) {
        why = "alive but still at step " + std::to_string(s1);
      }
      if (!why.empty())
        out += (out.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " (" + why + ")");
    }
    return out.empty()
               ? ""
               : "; did not arrive: " + out + "; this rank was at step " + std::to_string(mine);
  } catch (const std::exception&) {
    return "; the rendezvous store at " + env_.master_addr + ":" +
           std::to_string(env_.master_port) +
           " does not answer: its host (rank 0 or the launcher) died or hung";
  }
}

// A collective that fails (a peer died, hung past the timeout, or the network broke) ends this
// rank too: TrainingError (exit 3) naming this rank, what it was doing and the ranks that did
// not arrive.
template <class F>
void ProcessGroup::collective(const char* what, F&& f) const {
  const LaunchEnv& env = env_;
  try {
    f();
  } catch (const c10::OutOfMemoryError&) {
    throw;  // not the network's fault: the trainer's OOM report
  } catch (const UserError&) {
    throw;
  } catch (const TrainingError&) {
    throw;
  } catch (const std::exception& e) {  // c10::DistBackendError, gloo::IoException, ...
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string detail = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
    detail = detail.substr(0, detail.find('\n'));
    throw TrainingError("distributed: rank " + std::to_string(env.rank) + " of " +
                        std::to_string(env.world_size) + ": " + what +
                        " failed (another rank died, hung past distributed.timeout_s, or the "
                        "network failed): " +
                        detail.substr(0, 300) + missing_ranks());
  }
}

void ProcessGroup::allreduce_mean(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes) {
  allreduce_scaled(tensors, bucket_bytes, 1.0 / static_cast<double>(env_.world_size), kWorld);
}

void ProcessGroup::allreduce_scaled(const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes,
                                    double scale, int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) {  // a subgroup of one: its sum is the tensor
    if (!tensors.empty()) at::_foreach_mul_(tensors, scale);
    return;
  }
  std::vector<int64_t> bytes;
  for (const auto& t : tensors) bytes.push_back(static_cast<int64_t>(t.nbytes()));
  for (const auto& bucket : pack_buckets(bytes, bucket_bytes)) {
    std::vector<torch::Tensor> parts, members;
    for (size_t t : bucket) {
      parts.push_back(tensors[t].reshape({-1}));
      members.push_back(tensors[t]);
    }
    std::vector<torch::Tensor> flat{on_backend_device(torch::cat(parts))};
    collective("gradient all-reduce", [&] { g.backend->allreduce(flat)->wait(); });
    flat[0].mul_(scale);
    copy_from_flat(flat[0], members);
  }
}

// NCCL works on the GPU only: a host tensor travels through the rank's GPU and back.
torch::Tensor ProcessGroup::on_backend_device(const torch::Tensor& t) const {
  if (backend_ != config::DistBackend::kNccl || t.is_cuda()) return t;
  return t.to(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env_.local_rank)));
}

void ProcessGroup::allreduce_sum(torch::Tensor& t, int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) return;
  std::vector<torch::Tensor> v{on_backend_device(t)};
  collective("all-reduce", [&] { g.backend->allreduce(v)->wait(); });
  if (!v[0].is_same(t)) t.copy_(v[0]);
}

torch::Tensor ProcessGroup::all_gather_rows(const torch::Tensor& t, int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) return t;
  std::vector<torch::Tensor> in{on_backend_device(t).contiguous()};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int64_t r = 0; r < g.size; ++r) out[0].push_back(torch::empty_like(in[0]));
  collective("all-gather", [&] { g.backend->allgather(out, in)->wait(); });
  return torch::cat(out[0]).to(t.device());
}

std::function<void()> ProcessGroup::reduce_sum_async(const torch::Tensor& t, int64_t root,
                                                     int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) return [] {};  // a subgroup of one: the sum is the tensor
  auto v = std::make_shared<std::vector<torch::Tensor>>(1, on_backend_device(t));
  c10d::ReduceOptions o;
  o.rootRank = root;
  o.reduceOp = c10d::ReduceOp::SUM;
  c10::intrusive_ptr<c10d::Work> work;
  collective("gradient reduce", [&] { work = g.backend->reduce(*v, o); });
  return [this, v, work, t]() mutable {
    collective("gradient reduce", [&] { work->wait(); });
    if (!(*v)[0].is_same(t)) t.copy_((*v)[0]);
  };
}

void ProcessGroup::broadcast(torch::Tensor& t, int64_t root, int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) return;
  std::vector<torch::Tensor> v{on_backend_device(t)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  collective("broadcast", [&] { g.backend->broadcast(v, o)->wait(); });
  if (!v[0].is_same(t)) t.copy_(v[0]);
}

torch::Tensor ProcessGroup::all_to_all(const torch::Tensor& rows, const std::vector<int64_t>& send,
                                       const std::vector<int64_t>& recv, int64_t group) {
  const auto& g = impl_->groups.at(static_cast<size_t>(group));
  if (!g.backend) return rows;  // a subgroup of one
  auto in = on_backend_device(rows).contiguous();
  auto shape = in.sizes().vec();
  shape[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  auto out = torch::empty(shape, in.options());
  std::vector<int64_t> out_splits = recv, in_splits = send;
  collective("all-to-all",
             [&] { g.backend->alltoall_base(out, in, out_splits, in_splits)->wait(); });
  return out.to(rows.device());
}

std::vector<std::string> ProcessGroup::allgather_text(const std::string& key,
                                                      const std::string& mine) {
  const std::string prefix = "moe-train/" + key + "/";
  impl_->store->set(prefix + std::to_string(env_.rank),
                    std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> out;
  collective("config exchange", [&] {
    for (int64_t r = 0; r < env_.world_size; ++r) {
      const auto v = impl_->store->get(prefix + std::to_string(r));  // waits for it
      out.emplace_back(v.begin(), v.end());
    }
  });
  return out;
}

void ProcessGroup::enable_gradient_sync(const std::vector<torch::Tensor>& params,
                                        int64_t bucket_bytes) {
  auto& im = *impl_;
  im.group = c10::make_intrusive<c10d::ProcessGroup>(im.store, static_cast<int>(env_.rank),
                                                     static_cast<int>(env_.world_size));
  const auto type = backend_ == config::DistBackend::kNccl ? c10d::ProcessGroup::BackendType::NCCL
                                                           : c10d::ProcessGroup::BackendType::GLOO;
  const auto device = params.front().device().type();
  im.group->setBackend(device, type, im.backend);
  im.group->setDefaultBackend(type);
  // DDP's bucketing: a small first bucket (its all-reduce starts early), then bucket_bytes.
  // gradient_as_bucket_view: after the Reducer's copy the gradients are views into its buckets
  // (measured on bench-cpu-small at micro-batch 1 per rank: 648 -> 593 MiB at stage 0).
  const auto sizes = std::vector<size_t>{1 << 20, static_cast<size_t>(bucket_bytes)};
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, sizes);
  std::vector<int64_t> caps(limits.begin(), limits.end());
  im.reducer = std::make_shared<c10d::Reducer>(
      params, std::move(buckets), im.group, std::vector<bool>(params.size(), false), bucket_bytes,
      /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/true,
      std::unordered_map<size_t, std::string>{}, /*first_bucket_bytes_cap=*/1 << 20,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false, caps);
}

bool ProcessGroup::gradient_sync_enabled() const { return impl_->reducer != nullptr; }

void ProcessGroup::prepare_gradient_sync(const torch::Tensor& loss) {
  collective("gradient sync", [&] { impl_->reducer->prepare_for_backward({loss}); });
}

void ProcessGroup::guard(const char* what, const std::function<void()>& f) { collective(what, f); }

void ProcessGroup::barrier() {
  collective("barrier", [&] { impl_->backend->barrier()->wait(); });
}

}  // namespace moe::parallel
