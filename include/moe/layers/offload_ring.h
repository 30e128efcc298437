// The expert offload tier's ring (moe.offload_experts, docs/finetune.md): each MoE layer's
// frozen expert base (16-bit stacks or 4-bit codes and statistics) is packed into one host
// buffer (pinned on a GPU), and a use copies it whole into one of a few device buffers, the
// slots. A fetch that finds its layer in a slot copies nothing; a miss refills the least recently
// used slot. After each fetch the next layer in the direction of travel (up in the forward, down
// in the recomputation and the backward, turning at either end) is copied ahead on a side stream,
// so that on a GPU the copy runs behind the current layer's compute. On the CPU the "device" is a
// second host buffer reached through the same code path (the tier's test).
//
// What is fetched is read only until the next fetch of another layer: a GEMM that needs its
// weight again in the backward fetches it again (frozen_expert_matmul below), it never keeps a
// slot's view.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/types.h>

namespace moe::layers {

// What the ring has done, for the log and the tests (its allocation counters: the slots are the
// only device memory it holds).
struct OffloadCounters {
  int64_t fetches = 0;          // uses asked for
  int64_t hits = 0;             // ... found in a slot (copied ahead, or still there)
  int64_t copies = 0;           // layers copied host -> device (misses and prefetches)
  int64_t prefetches = 0;       // ... of which ahead of use
  int64_t bytes_copied = 0;     // host -> device bytes
  int64_t slot_bytes = 0;       // device bytes the slots hold now
  int64_t peak_slot_bytes = 0;  // ... at most
  int64_t slot_allocations = 0;
};

class OffloadRing {
 public:
  // `slots` >= 2: the layer being computed and the one fetched ahead.
  OffloadRing(int64_t slots, const torch::Device& device);
  ~OffloadRing();
  OffloadRing(const OffloadRing&) = delete;
  OffloadRing& operator=(const OffloadRing&) = delete;

  // The tensors of a layer's frozen base in a fixed order (undefined ones allowed: they stay
  // undefined). Called at each fetch: tensors replaced since the last one (weights loaded,
  // requantized or merged) are packed again.
  using Collect = std::function<std::vector<torch::Tensor*>()>;
  void add_layer(int64_t layer, Collect collect);

  // The layer's tensors on the device, in Collect's order. Valid until the next fetch of another
  // layer.
  const std::vector<torch::Tensor>& fetch(int64_t layer);
  // Forgets what the slots hold (the host values changed in place, e.g. merged adapters).
  void invalidate();

  OffloadCounters counters() const;
  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  const torch::Device& device() const { return device_; }
  // Bytes of the packed host buffers (after each layer's first fetch), and of the largest layer.
  int64_t host_bytes() const;
  int64_t largest_layer_bytes() const;
  // "12 layers (1.50 GiB) on the host, a ring of 2 layers (256.0 MiB) on cuda:0: ..." for the log.
  std::string summary() const;

 private:
  struct Layer;
  struct Slot;
  struct Sync;  // the copy stream and its events on a GPU
  Layer& packed(int64_t layer);
  Slot& slot_for(int64_t layer);
  void copy_into(Slot& s, Layer& l, bool ahead);
  int64_t next_layer(int64_t layer);

  torch::Device device_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::map<int64_t, std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Sync> sync_;
  OffloadCounters counters_;
  int64_t last_layer_ = -1, direction_ = 1, tick_ = 0;
  mutable std::mutex mutex_;
};

// Where a frozen weight lives in a ring: its layer, and the index of its first tensor in the
// layer's list.
struct OffloadedPlace {
  std::shared_ptr<OffloadRing> ring;
  int64_t layer = -1;
  int64_t first = 0;
  explicit operator bool() const { return ring != nullptr; }
  const std::vector<torch::Tensor>& fetch() const { return ring->fetch(layer); }
};

// x [n, in] @ stack[expert] [in, out] for an offloaded frozen 16-bit stack (the tensor at
// `place`): the stack is fetched for the forward and again for the backward, which computes
// x's gradient only (the base is frozen), as autograd's mm does.
torch::Tensor frozen_expert_matmul(const torch::Tensor& x, const OffloadedPlace& place,
                                   int64_t expert);
// Expert-ordered bf16 rows with group ends `offs` through the whole offloaded stack (grouped
// GEMM, CUDA): the stack fetched again for the backward.
torch::Tensor frozen_grouped_mm(const torch::Tensor& x_bf16, const OffloadedPlace& place,
                                const torch::Tensor& offs);

}  // namespace moe::layers
