#include "moe/data/blended_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "moe/util/errors.h"
#include "moe/util/splitmix.h"

namespace moe::data {

namespace {

// The source sample `i` (0-based) comes from, given what each source has given so far.
size_t pick_source(const std::vector<double>& w, const std::vector<int64_t>& taken, int64_t i) {
  size_t best = 0;
  double best_gap = -INFINITY;
  for (size_t s = 0; s < w.size(); ++s) {
    const double gap = w[s] * static_cast<double>(i + 1) - static_cast<double>(taken[s]);
    if (gap > best_gap) best_gap = gap, best = s;
  }
  return best;
}

// Each source's loader gets its own seed, so that two sources never share a shuffle.
uint64_t source_seed(uint64_t seed, size_t s) {
  return splitmix64(seed + 0x9e3779b97f4a7c15ULL * s);
}

}  // namespace

struct BlendedLoader::Impl {
  std::vector<double> weights;   // normalised
  std::vector<int64_t> windows;  // per source, one pass
  std::vector<int64_t> taken;    // per source, samples given so far (all passes)
  std::vector<std::unique_ptr<StreamingLoader>> sources;
  LoaderOptions opt;
  BufferFactory factory;
  int64_t total = 0;  // windows of one blend epoch
  int64_t next_sample = 0;
};

std::vector<int64_t> BlendedLoader::samples_per_source(const std::vector<double>& weights,
                                                       int64_t samples) {
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t i = 0; i < samples; ++i) ++taken[pick_source(weights, taken, i)];
  return taken;
}

BlendedLoader::BlendedLoader(std::vector<BlendPart> parts, LoaderOptions opt, LoaderState start,
                             BufferFactory factory)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (parts.empty()) throw UserError("data.blend: no sources");
  double sum = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    const double w = parts[s].weight;
    if (!(w > 0) || !std::isfinite(w)) {
      throw UserError("data.blend[" + std::to_string(s) + "].weight = " + std::to_string(w) +
                      ": must be a finite number > 0");
    }
    require_windows(parts[s].shards, opt.seq_len);
    sum += w;
  }
  m.opt = opt;
  m.factory = std::move(factory);
  for (auto& p : parts) {
    m.weights.push_back(p.weight / sum);
    int64_t n = 0;
    for (const auto& sh : p.shards) n += sh.num_tokens / (opt.seq_len + 1);
    m.windows.push_back(n);
    m.total += n;
  }
  if (start.epoch < 0 || start.position < 0 || start.position >= m.total) {
    throw UserError("data: loader state (epoch " + std::to_string(start.epoch) + ", position " +
                    std::to_string(start.position) + ") does not fit the blend's epoch of " +
                    std::to_string(m.total) + " windows");
  }
  m.next_sample = start.epoch * m.total + start.position;
  m.taken = samples_per_source(m.weights, m.next_sample);
  for (size_t s = 0; s < parts.size(); ++s) {
    LoaderOptions so = opt;
    so.batch_size = 1;  // the blend interleaves single windows
    so.seed = source_seed(opt.seed, s);
    so.prefetch = std::max<int64_t>(1, opt.prefetch * opt.batch_size);
    const LoaderState at{m.taken[s] / m.windows[s], m.taken[s] % m.windows[s]};
    m.sources.push_back(std::make_unique<StreamingLoader>(std::move(parts[s].shards), so, at));
  }
}

BlendedLoader::~BlendedLoader() = default;

Batch BlendedLoader::next() {
  Impl& m = *impl_;
  const int64_t cols = m.opt.seq_len + 1, rows = m.opt.batch_size;
  Batch out;
  out.rows = rows;
  out.cols = cols;
  out.buffer = make_buffer(m.factory, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t s = pick_source(m.weights, m.taken, m.next_sample);
    Batch one = m.sources[s]->next();
    std::memcpy(out.buffer.data + r * cols, one.buffer.data,
                static_cast<size_t>(cols) * sizeof(int64_t));
    ++m.taken[s];
    ++m.next_sample;
  }
  out.state_after = {m.next_sample / m.total, m.next_sample % m.total};
  return out;
}

double BlendedLoader::wait_seconds() const {
  double w = 0;
  for (const auto& s : impl_->sources) w += s->wait_seconds();
  return w;
}

int64_t BlendedLoader::windows_per_epoch() const { return impl_->total; }

std::vector<int64_t> BlendedLoader::source_passes() const {
  std::vector<int64_t> p;
  for (size_t s = 0; s < impl_->windows.size(); ++s) {
    // The pass the next sample of this source belongs to, counted from 1.
    p.push_back(impl_->taken[s] / impl_->windows[s] + 1);
  }
  return p;
}

}  // namespace moe::data
