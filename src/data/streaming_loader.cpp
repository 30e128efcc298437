#include "moe/data/streaming_loader.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "moe/util/errors.h"
#include "moe/util/splitmix.h"

namespace moe::data {

namespace {

struct Block {
  size_t shard;
  int64_t first_window;
  int64_t count;
};

}  // namespace

BatchBuffer make_buffer(const BufferFactory& factory, int64_t num_tokens) {
  if (factory) return factory(num_tokens);
  auto mem = std::shared_ptr<int64_t[]>(new int64_t[static_cast<size_t>(num_tokens)]);
  return {mem.get(), mem};
}

void require_windows(const std::vector<ShardInfo>& shards, int64_t seq_len) {
  if (shards.empty()) throw UserError("data: no shards to read");
  for (const auto& s : shards) {
    if (s.num_tokens < seq_len + 1) {
      throw UserError("data: " + s.path + ": holds " + std::to_string(s.num_tokens) +
                      " tokens; one window needs seq_len + 1 = " + std::to_string(seq_len + 1));
    }
  }
}

struct StreamingLoader::Impl {
  std::vector<ShardInfo> shards;
  LoaderOptions opt;
  BufferFactory factory;
  int64_t window = 0;
  std::vector<Block> blocks;  // natural order
  int64_t windows_per_epoch = 0;

  // An epoch's block order and the windows before each block in that order.
  struct Plan {
    int64_t epoch = -1;
    std::vector<size_t> order;
    std::vector<int64_t> prefix;
  };

  Plan plan_for(int64_t epoch) const {
    Plan p;
    p.epoch = epoch;
    p.order.resize(blocks.size());
    std::iota(p.order.begin(), p.order.end(), size_t{0});
    if (opt.shuffle) {
      std::mt19937_64 rng(splitmix64(opt.seed ^ splitmix64(static_cast<uint64_t>(epoch))));
      std::shuffle(p.order.begin(), p.order.end(), rng);
    }
    p.prefix.resize(blocks.size() + 1, 0);
    for (size_t i = 0; i < blocks.size(); ++i)
      p.prefix[i + 1] = p.prefix[i] + blocks[p.order[i]].count;
    return p;
  }

  std::vector<int64_t> window_order(int64_t epoch, size_t block_pos, int64_t count) const {
    std::vector<int64_t> w(static_cast<size_t>(count));
    std::iota(w.begin(), w.end(), int64_t{0});
    if (opt.shuffle) {
      std::mt19937_64 rng(splitmix64(
          opt.seed ^ splitmix64(static_cast<uint64_t>(epoch) * 1000003ULL + block_pos + 1)));
      std::shuffle(w.begin(), w.end(), rng);
    }
    return w;
  }

  // ---- shared state ----
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_read = 0;     // next global block number to read (epoch * nblocks + pos)
  int64_t assembler_at = 0;  // global block number the assembler waits for
  int64_t lookahead = 2;
  std::map<int64_t, std::vector<int32_t>> ready;
  std::deque<Batch> out;
  std::exception_ptr error;
  bool stop = false;
  double wait_s = 0.0;
  std::vector<std::thread> readers;
  std::thread assembler;

  int64_t nblocks() const { return static_cast<int64_t>(blocks.size()); }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = e;
    stop = true;
    cv.notify_all();
  }

  // Shards that are not local (s3://) are fetched ahead: those of the next few blocks of this
  // epoch's order, so the readers find them in the cache.
  void prefetch_after(const Plan& plan, int64_t g) const {
    constexpr int kShardsAhead = 2;
    int asked = 0;
    size_t last = SIZE_MAX;
    for (int64_t k = g + 1; k < (g / nblocks() + 1) * nblocks() && asked < kShardsAhead; ++k) {
      const size_t shard = blocks[plan.order[static_cast<size_t>(k % nblocks())]].shard;
      if (shard == last) continue;
      last = shard;
      if (!shards[shard].remote) return;
      shards[shard].remote->prefetch(shards[shard].path);
      ++asked;
      if (k > g + 64) break;
    }
  }

  void reader_loop() {
    Plan plan;
    try {
      while (true) {
        int64_t g;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || next_read < assembler_at + lookahead; });
          if (stop) return;
          g = next_read++;
        }
        const int64_t epoch = g / nblocks();
        if (plan.epoch != epoch) plan = plan_for(epoch);
        const Block& b = blocks[plan.order[static_cast<size_t>(g % nblocks())]];
        prefetch_after(plan, g);
        auto tokens = read_tokens(shards[b.shard], b.first_window * window, b.count * window);
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(g, std::move(tokens));
        cv.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  BatchBuffer new_buffer(int64_t n) const { return make_buffer(factory, n); }

  void assembler_loop(LoaderState start) {
    try {
      int64_t epoch = start.epoch;
      Plan plan = plan_for(epoch);
      size_t pos = static_cast<size_t>(
          std::upper_bound(plan.prefix.begin(), plan.prefix.end(), start.position) -
          plan.prefix.begin() - 1);
      int64_t skip = start.position - plan.prefix[pos];
      const int64_t B = opt.batch_size;
      Batch batch;
      int64_t row = 0;
      while (true) {
        const int64_t g = epoch * nblocks() + static_cast<int64_t>(pos);
        std::vector<int32_t> tokens;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || ready.count(g) != 0; });
          if (stop) return;
          tokens = std::move(ready[g]);
          ready.erase(g);
          assembler_at = g + 1;
          cv.notify_all();
        }
        const Block& b = blocks[plan.order[pos]];
        const auto order = window_order(epoch, pos, b.count);
        for (int64_t i = skip; i < b.count; ++i) {
          if (row == 0) {
            batch = Batch();
            batch.rows = B;
            batch.cols = window;
            batch.buffer = new_buffer(B * window);
          }
          const int32_t* src = tokens.data() + order[static_cast<size_t>(i)] * window;
          std::copy(src, src + window, batch.buffer.data + row * window);
          if (++row == B) {
            int64_t position = plan.prefix[pos] + i + 1;
            batch.state_after = position == windows_per_epoch ? LoaderState{epoch + 1, 0}
                                                              : LoaderState{epoch, position};
            row = 0;
            std::unique_lock<std::mutex> lock(mu);
            cv.wait(lock, [&] { return stop || static_cast<int64_t>(out.size()) < opt.prefetch; });
            if (stop) return;
            out.push_back(std::move(batch));
            cv.notify_all();
          }
        }
        skip = 0;
        if (++pos == blocks.size()) {
          pos = 0;
          plan = plan_for(++epoch);
        }
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }
};

StreamingLoader::StreamingLoader(std::vector<ShardInfo> shards, LoaderOptions opt,
                                 LoaderState start, BufferFactory factory)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  if (opt.seq_len < 1 || opt.batch_size < 1 || opt.block_windows < 1 || opt.prefetch < 1) {
    throw UserError("data: loader needs seq_len, batch_size, block_windows and prefetch >= 1");
  }
  require_windows(shards, opt.seq_len);
  m.shards = std::move(shards);
  m.opt = opt;
  m.factory = std::move(factory);
  m.window = opt.seq_len + 1;
  for (size_t s = 0; s < m.shards.size(); ++s) {
    const int64_t n = m.shards[s].num_tokens / m.window;
    for (int64_t first = 0; first < n; first += opt.block_windows) {
      m.blocks.push_back({s, first, std::min(opt.block_windows, n - first)});
    }
    m.windows_per_epoch += n;
  }
  if (start.epoch < 0 || start.position < 0 || start.position >= m.windows_per_epoch) {
    throw UserError("data: loader state (epoch " + std::to_string(start.epoch) + ", position " +
                    std::to_string(start.position) + ") is outside an epoch of " +
                    std::to_string(m.windows_per_epoch) + " windows");
  }
  const int threads = std::max(1, opt.reader_threads);
  m.lookahead = threads + 1;
  // Readers start at the assembler's block.
  Impl::Plan plan = m.plan_for(start.epoch);
  const auto pos = std::upper_bound(plan.prefix.begin(), plan.prefix.end(), start.position) -
                   plan.prefix.begin() - 1;
  m.next_read = m.assembler_at = start.epoch * m.nblocks() + pos;
  for (int i = 0; i < threads; ++i) m.readers.emplace_back([&m] { m.reader_loop(); });
  m.assembler = std::thread([&m, start] { m.assembler_loop(start); });
}

StreamingLoader::~StreamingLoader() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->cv.notify_all();
  }
  for (auto& t : impl_->readers) t.join();
  impl_->assembler.join();
}

Batch StreamingLoader::next() {
  auto& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(m.mu);
  m.cv.wait(lock, [&] { return !m.out.empty() || m.error; });
  m.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (m.out.empty()) std::rethrow_exception(m.error);
  Batch b = std::move(m.out.front());
  m.out.pop_front();
  m.cv.notify_all();
  return b;
}

int64_t StreamingLoader::windows_per_epoch() const { return impl_->windows_per_epoch; }

double StreamingLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->wait_s;
}

}  // namespace moe::data
