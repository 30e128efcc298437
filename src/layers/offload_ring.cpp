#include "moe/layers/offload_ring.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <optional>

namespace moe::layers {

namespace {

constexpr int64_t kRingAlign = 256;  // each tensor's bytes start here: any dtype's view is aligned

int64_t ring_aligned(int64_t n) { return (n + kRingAlign - 1) / kRingAlign * kRingAlign; }

// A tensor of `dtype` and `sizes` over `bytes` of `flat` (uint8) from `offset`.
torch::Tensor ring_view(const torch::Tensor& flat, int64_t offset, int64_t bytes,
                        torch::ScalarType dtype, c10::IntArrayRef sizes) {
  return flat.narrow(0, offset, bytes).view(dtype).view(sizes);
}

std::string ring_bytes_text(int64_t bytes) {
  char s[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024));
  }
  return s;
}

}  // namespace

// A layer's frozen base packed into one host buffer: each tensor at an aligned offset.
struct OffloadRing::Layer {
  Collect collect;
  torch::Tensor host;  // uint8
  struct Place {
    int64_t offset = -1;  // -1: an undefined tensor
    int64_t bytes = 0;
    torch::ScalarType dtype = torch::kByte;
    std::vector<int64_t> sizes;
    const void* data = nullptr;  // what the collected tensor pointed at once packed
  };
  std::vector<Place> places;
  int64_t bytes = 0;
};

struct OffloadRing::Slot {
  torch::Tensor buffer;  // uint8, on the device
  int64_t layer = -1;
  int64_t last_use = 0;
  std::vector<torch::Tensor> views;  // the layer's tensors over `buffer`
};

struct OffloadRing::Sync {
  std::optional<c10::cuda::CUDAStream> copy;
  std::vector<at::cuda::CUDAEvent> ready;  // per slot: its last copy
};

OffloadRing::OffloadRing(int64_t slots, const torch::Device& device)
    : device_(device), sync_(std::make_unique<Sync>()) {
  TORCH_CHECK(slots >= 2, "an offload ring needs 2 slots or more, got ", slots);
  for (int64_t i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
  if (device_.is_cuda()) {
    sync_->copy = c10::cuda::getStreamFromPool(false, device_.index());
    sync_->ready = std::vector<at::cuda::CUDAEvent>(static_cast<size_t>(slots));
  }
}

OffloadRing::~OffloadRing() = default;

void OffloadRing::add_layer(int64_t layer, Collect collect) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto l = std::make_unique<Layer>();
  l->collect = std::move(collect);
  layers_[layer] = std::move(l);
}

OffloadRing::Layer& OffloadRing::packed(int64_t layer) {
  const auto it = layers_.find(layer);
  TORCH_CHECK(it != layers_.end(), "offload ring: layer ", layer, " was never added");
  Layer& l = *it->second;
  const std::vector<torch::Tensor*> tensors = l.collect();
  bool current = l.host.defined() && tensors.size() == l.places.size();
  for (size_t i = 0; current && i < tensors.size(); ++i) {
    const bool defined = tensors[i]->defined();
    current = defined == (l.places[i].offset >= 0) &&
              (!defined || tensors[i]->data_ptr() == l.places[i].data);
  }
  if (current) return l;
  // First use, or the tensors were replaced (loaded, requantized, merged): pack them again and
  // forget any slot that holds the old values.
  for (auto& s : slots_) {
    if (s->layer == layer) s->layer = -1;
  }
  l.places.assign(tensors.size(), Layer::Place{});
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i]->defined()) continue;
    auto& p = l.places[i];
    p.offset = bytes;
    p.bytes = tensors[i]->numel() * static_cast<int64_t>(tensors[i]->element_size());
    p.dtype = tensors[i]->scalar_type();
    p.sizes = tensors[i]->sizes().vec();
    bytes = ring_aligned(bytes + p.bytes);
  }
  l.bytes = bytes;
  // Pinned on a GPU: the copies run asynchronously on the side stream.
  l.host =
      torch::empty({std::max<int64_t>(bytes, 1)},
                   torch::TensorOptions().dtype(torch::kByte).pinned_memory(device_.is_cuda()));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& p = l.places[i];
    if (p.offset < 0) continue;
    auto view = ring_view(l.host, p.offset, p.bytes, p.dtype, p.sizes);
    view.copy_(*tensors[i]);
    tensors[i]->set_data(view);  // the parameter or state now lives in the packed buffer
    p.data = tensors[i]->data_ptr();
  }
  return l;
}

int64_t OffloadRing::next_layer(int64_t layer) {
  auto it = layers_.find(layer);
  if (layers_.size() < 2) return -1;
  if (direction_ > 0) {
    if (std::next(it) != layers_.end()) return std::next(it)->first;
    direction_ = -1;  // the forward's end: the backward comes down from here
    return std::prev(it)->first;
  }
  if (it != layers_.begin()) return std::prev(it)->first;
  direction_ = 1;  // the backward's end: the next forward goes up from here
  return std::next(it)->first;
}

OffloadRing::Slot& OffloadRing::slot_for(int64_t layer) {
  // The slot holding the layer, else a free one, else the least recently used (never the layer
  // just fetched: its last_use is the newest).
  Slot* best = nullptr;
  for (auto& s : slots_) {
    if (s->layer == layer) return *s;
    if (!best || (s->layer < 0 && best->layer >= 0) ||
        ((s->layer < 0) == (best->layer < 0) && s->last_use < best->last_use)) {
      best = s.get();
    }
  }
  return *best;
}

void OffloadRing::copy_into(Slot& s, Layer& l, bool ahead) {
  const size_t index = static_cast<size_t>(
      std::find_if(slots_.begin(), slots_.end(), [&](const auto& p) { return p.get() == &s; }) -
      slots_.begin());
  if (!s.buffer.defined() || s.buffer.numel() < l.bytes) {
    if (s.buffer.defined()) {
      // A larger layer than the slot was made for: nothing may still read or fill the old one.
      if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
      counters_.slot_bytes -= s.buffer.numel();
    }
    s.buffer = torch::empty({std::max<int64_t>(l.bytes, 1)},
                            torch::TensorOptions().dtype(torch::kByte).device(device_));
    counters_.slot_bytes += s.buffer.numel();
    counters_.peak_slot_bytes = std::max(counters_.peak_slot_bytes, counters_.slot_bytes);
    ++counters_.slot_allocations;
  }
  const auto src = l.host.narrow(0, 0, l.bytes), dst = s.buffer.narrow(0, 0, l.bytes);
  if (device_.is_cuda()) {
    // The slot's last readers are all enqueued on the compute stream before now.
    at::cuda::CUDAEvent compute_point;
    compute_point.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    compute_point.block(*sync_->copy);
    c10::cuda::CUDAStreamGuard guard(*sync_->copy);
    dst.copy_(src, /*non_blocking=*/true);
    sync_->ready[index].record(*sync_->copy);
  } else {
    dst.copy_(src);
  }
  s.views.assign(l.places.size(), torch::Tensor());
  for (size_t i = 0; i < l.places.size(); ++i) {
    const auto& p = l.places[i];
    if (p.offset >= 0) s.views[i] = ring_view(s.buffer, p.offset, p.bytes, p.dtype, p.sizes);
  }
  ++counters_.copies;
  counters_.bytes_copied += l.bytes;
  if (ahead) ++counters_.prefetches;
}

const std::vector<torch::Tensor>& OffloadRing::fetch(int64_t layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.fetches;
  if (layer != last_layer_) {
    if (last_layer_ >= 0) direction_ = layer > last_layer_ ? 1 : -1;
    last_layer_ = layer;
  }
  Layer& l = packed(layer);
  Slot& s = slot_for(layer);
  if (s.layer == layer) {
    ++counters_.hits;
  } else {
    s.layer = -1;
    copy_into(s, l, false);
    s.layer = layer;
  }
  s.last_use = ++tick_;
  if (device_.is_cuda()) {
    const size_t index = static_cast<size_t>(
        std::find_if(slots_.begin(), slots_.end(), [&](const auto& p) { return p.get() == &s; }) -
        slots_.begin());
    sync_->ready[index].block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
  // The next layer in the direction of travel, copied ahead into another slot.
  const int64_t next = next_layer(layer);
  if (next >= 0) {
    Slot& t = slot_for(next);
    if (t.layer != next) {
      Layer& n = packed(next);
      t.layer = -1;
      copy_into(t, n, true);
      t.layer = next;
      t.last_use = tick_;  // older than the layer in use, newer than the rest
    }
  }
  return s.views;
}

void OffloadRing::invalidate() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& s : slots_) s->layer = -1;
}

OffloadCounters OffloadRing::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

int64_t OffloadRing::host_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t b = 0;
  for (const auto& [i, l] : layers_) b += l->bytes;
  return b;
}

int64_t OffloadRing::largest_layer_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t b = 0;
  for (const auto& [i, l] : layers_) b = std::max(b, l->bytes);
  return b;
}

std::string OffloadRing::summary() const {
  const OffloadCounters c = counters();
  return std::to_string(layers_.size()) + " MoE layers' experts (" + ring_bytes_text(host_bytes()) +
         ") in host memory, a ring of " + std::to_string(slots()) + " slots (" +
         ring_bytes_text(c.peak_slot_bytes) + " at most) on " + device_.str() + ": " +
         std::to_string(c.fetches) + " fetches, " + std::to_string(c.hits) + " found in a slot, " +
         std::to_string(c.copies) + " copies (" + std::to_string(c.prefetches) + " ahead, " +
         ring_bytes_text(c.bytes_copied) + "); slot bytes at most " +
         std::to_string(c.peak_slot_bytes) + " of a planned " +
         std::to_string(slots() * largest_layer_bytes()) + " (" + std::to_string(slots()) +
         " x the largest layer)";
}

namespace {

// What a graph node holds to fetch the stack again in its backward.
struct HeldOffloadedPlace : torch::CustomClassHolder {
  OffloadedPlace place;
};
c10::IValue hold_place(const OffloadedPlace& p) {
  auto h = c10::make_intrusive<HeldOffloadedPlace>();
  h->place = p;
  return c10::IValue::make_capsule(std::move(h));
}
const OffloadedPlace& held_place(const c10::IValue& v) {
  return c10::static_intrusive_pointer_cast<HeldOffloadedPlace>(v.toCapsule())->place;
}

// x @ W[e] with W fetched again for the backward, whose x gradient is what autograd's mm
// computes (mm_mat1_backward: column-major inputs get a column-major gradient).
class FrozenExpertMatmulFn : public torch::autograd::Function<FrozenExpertMatmulFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const OffloadedPlace& place, int64_t expert) {
    ctx->saved_data["place"] = hold_place(place);
    ctx->saved_data["expert"] = expert;
    ctx->saved_data["column_major"] = x.dim() == 2 && x.stride(0) == 1 && x.stride(1) == x.size(0);
    return x.matmul(place.fetch()[static_cast<size_t>(place.first)][expert]);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const OffloadedPlace& place = held_place(ctx->saved_data["place"]);
    const auto w =
        place.fetch()[static_cast<size_t>(place.first)][ctx->saved_data["expert"].toInt()];
    const auto gx =
        ctx->saved_data["column_major"].toBool() ? w.mm(grads[0].t()).t() : grads[0].mm(w.t());
    return {gx, torch::Tensor(), torch::Tensor()};
  }
};

class FrozenGroupedMmFn : public torch::autograd::Function<FrozenGroupedMmFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const OffloadedPlace& place, const torch::Tensor& offs) {
    ctx->saved_data["place"] = hold_place(place);
    ctx->save_for_backward({offs});
    const auto& w = place.fetch()[static_cast<size_t>(place.first)];
    return at::_grouped_mm(x, w.to(torch::kBFloat16), offs);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const OffloadedPlace& place = held_place(ctx->saved_data["place"]);
    const auto offs = ctx->get_saved_variables()[0];
    const auto& w = place.fetch()[static_cast<size_t>(place.first)];
    const auto gx = at::_grouped_mm(grads[0].to(torch::kBFloat16),
                                    w.to(torch::kBFloat16).transpose(-2, -1), offs);
    return {gx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor frozen_expert_matmul(const torch::Tensor& x, const OffloadedPlace& place,
                                   int64_t expert) {
  return FrozenExpertMatmulFn::apply(x, place, expert);
}

torch::Tensor frozen_grouped_mm(const torch::Tensor& x_bf16, const OffloadedPlace& place,
                                const torch::Tensor& offs) {
  return FrozenGroupedMmFn::apply(x_bf16, place, offs);
}

}  // namespace moe::layers
