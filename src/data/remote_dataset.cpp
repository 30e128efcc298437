#include "moe/data/remote_dataset.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "moe/data/token_shard.h"
#include "moe/data/verify.h"
#include "moe/util/errors.h"
#include "moe/util/s3_client.h"

namespace moe::data {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class ShardCache : public ShardFetcher {
 public:
  ShardCache(std::shared_ptr<s3::Client> client, Manifest manifest, s3::Url root,
             RemoteCacheOptions opt)
      : client_(std::move(client)),
        manifest_(std::move(manifest)),
        root_(std::move(root)),
        opt_(std::move(opt)) {
    for (const auto& [split, shards] : manifest_.splits) {
      for (const auto& s : shards) {
        Entry e;
        e.meta = s;
        std::error_code ec;
        // A file left by an earlier run counts against the bound; it is verified before use.
        if (fs::is_regular_file(path_of(s.file), ec)) {
          e.state = State::kUnverified;
          bytes_ += s.bytes;
        }
        entries_.emplace(path_of(s.file), std::move(e));
      }
    }
    for (int i = 0; i < std::max(1, opt_.prefetch_threads); ++i) {
      workers_.emplace_back([this] { prefetch_loop(); });
    }
  }

  ~ShardCache() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    client_->abort();  // a prefetch in flight (or in its retries) ends now
    for (auto& t : workers_) t.join();
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (stats_.fetched_shards + stats_.hits > 0) {
      spdlog::info(
          "data: shard cache {}: {} shards fetched ({:.1f} MiB in {:.1f} s), {} reads from the "
          "cache, {} evicted, readers waited {:.2f} s, {} requests retried",
          opt_.dir, stats_.fetched_shards, double(stats_.fetched_bytes) / (1 << 20),
          stats_.fetch_seconds, stats_.hits, stats_.evictions, stats_.waited_seconds,
          client_->retries());
    }
  }

  std::string path_of(const std::string& file) const {
    return (fs::path(opt_.dir) / file).string();
  }

  std::shared_ptr<void> pin(const std::string& path) override {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    Entry& e = entry(path);
    bool waited = false;
    while (true) {
      if (e.state == State::kReady) break;
      if (e.state == State::kFetching) {
        waited = true;
        cv_.wait(lock);
        continue;
      }
      waited = true;
      fetch_locked(path, e, lock, /*for_prefetch=*/false);  // throws on a bad object
    }
    ++e.pins;
    e.last_use = ++clock_;
    e.prefetched = false;
    if (waited)
      stats_.waited_seconds += seconds_since(start);
    else
      ++stats_.hits;
    return std::shared_ptr<void>(nullptr, [this, path](void*) {
      std::lock_guard<std::mutex> l(mu_);
      --entries_.at(path).pins;
      cv_.notify_all();
    });
  }

  void prefetch(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entry(path);
    if (e.state == State::kReady || e.state == State::kFetching || e.queued) return;
    e.queued = true;
    queue_.push_back(path);
    cv_.notify_all();
  }

  RemoteCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  enum class State { kAbsent, kUnverified, kFetching, kReady };
  struct Entry {
    ManifestShard meta;
    State state = State::kAbsent;
    int pins = 0;
    uint64_t last_use = 0;
    bool queued = false;
    bool prefetched = false;  // fetched ahead and not read yet: evicted last
  };

  Entry& entry(const std::string& path) {
    auto it = entries_.find(path);
    if (it == entries_.end()) throw std::logic_error("shard cache: unknown shard " + path);
    return it->second;
  }

  // Frees room for `need` more bytes, least recently used first; pinned shards and shards being
  // fetched stay. Returns whether the bound now holds.
  bool make_room(int64_t need, bool spare_prefetched) {
    if (opt_.max_bytes <= 0) return true;
    while (bytes_ + need > opt_.max_bytes) {
      std::string victim;
      uint64_t oldest = UINT64_MAX;
      for (auto& [p, e] : entries_) {
        const bool evictable = (e.state == State::kReady || e.state == State::kUnverified) &&
                               e.pins == 0 && !(spare_prefetched && e.prefetched);
        if (evictable && e.last_use < oldest) {
          oldest = e.last_use;
          victim = p;
        }
      }
      if (victim.empty()) return false;
      Entry& v = entries_.at(victim);
      std::error_code ec;
      fs::remove(victim, ec);
      v.state = State::kAbsent;
      bytes_ -= v.meta.bytes;
      ++stats_.evictions;
    }
    return true;
  }

  // Called with the lock held and e absent or unverified; leaves it ready (or absent after an
  // error, which is rethrown). The lock is released while bytes move.
  void fetch_locked(const std::string& path, Entry& e, std::unique_lock<std::mutex>& lock,
                    bool for_prefetch) {
    // Before anything here is read, written or removed: this process owns the directory.
    lock_directory();
    const bool had_file = e.state == State::kUnverified;
    if (!had_file) {
      if (!make_room(e.meta.bytes, /*spare_prefetched=*/for_prefetch) && !warned_over_) {
        warned_over_ = true;
        spdlog::warn(
            "data: shard cache {}: data.cache_max_bytes = {} is smaller than the shards in use "
            "at once; exceeding it (give at least the largest shard x (reader threads + 2))",
            opt_.dir, opt_.max_bytes);
      }
      bytes_ += e.meta.bytes;
    }
    e.state = State::kFetching;
    // A name of this fetch's own: nothing else ever writes into it.
    const std::string part =
        path + ".part-" + std::to_string(::getpid()) + "-" + std::to_string(++parts_);
    lock.unlock();
    const auto start = Clock::now();
    std::string problem;
    bool downloaded = false;
    try {
      problem = had_file ? verify(path, e.meta) : "stale";
      if (!problem.empty()) {
        download(part, e.meta);
        downloaded = true;
        problem = verify(part, e.meta);
        if (problem.empty()) fs::rename(part, path);
      }
    } catch (...) {
      lock.lock();
      fail_locked(path, part, e);
      throw;
    }
    lock.lock();
    if (!problem.empty()) {
      fail_locked(path, part, e);
      throw UserError("data: " + root_.child(e.meta.file).str() + ": " + problem +
                      " (the object is damaged or was replaced; upload the dataset again with "
                      "prepare-data --out)");
    }
    if (downloaded) {
      ++stats_.fetched_shards;
      stats_.fetched_bytes += e.meta.bytes;
      stats_.fetch_seconds += seconds_since(start);
    }
    e.state = State::kReady;
    e.prefetched = for_prefetch;
    e.last_use = ++clock_;
    cv_.notify_all();
  }

  void fail_locked(const std::string& path, const std::string& part, Entry& e) {
    std::error_code ec;
    fs::remove(part, ec);
    fs::remove(path, ec);
    e.state = State::kAbsent;
    bytes_ -= e.meta.bytes;
    cv_.notify_all();
  }

  void download(const std::string& part, const ManifestShard& s) {
    client_->get_to_file(root_.child(s.file), s.bytes, part);
  }

  // One process per cache directory: another's eviction would remove files this one reads.
  void lock_directory() {
    std::lock_guard<std::mutex> lock(lock_mu_);
    if (lock_fd_ >= 0) return;
    std::error_code ec;
    fs::create_directories(opt_.dir, ec);
    if (ec) throw UserError("data.cache_dir: " + opt_.dir + ": cannot create: " + ec.message());
    const std::string file = (fs::path(opt_.dir) / ".lock").string();
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw UserError("data.cache_dir: " + file + ": cannot open: " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      throw UserError("data.cache_dir: " + opt_.dir +
                      " is in use by another moe-train process; give each run its own cache_dir");
    }
    lock_fd_ = fd;
    for (const auto& f : fs::directory_iterator(opt_.dir, ec)) {  // a killed run's downloads
      if (f.path().filename().string().find(".part-") != std::string::npos) fs::remove(f, ec);
    }
  }

  // Checksums first, then the HDF5 structure: a damaged object never reaches libhdf5's parser.
  std::string verify(const std::string& file, const ManifestShard& s) const {
    VerifyOptions v;
    v.checksums = true;
    return check_shard(file, s, manifest_, v);
  }

  void prefetch_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const std::string path = queue_.front();
      queue_.pop_front();
      Entry& e = entry(path);
      e.queued = false;
      if (e.state != State::kAbsent && e.state != State::kUnverified) continue;
      // Never evict to prefetch when nothing is free: the shards in use come first.
      if (opt_.max_bytes > 0 && e.state == State::kAbsent &&
          !make_room(e.meta.bytes, /*spare_prefetched=*/true)) {
        continue;
      }
      try {
        fetch_locked(path, e, lock, /*for_prefetch=*/true);
      } catch (const std::exception& ex) {
        // The reader's own pin() fetches it again and reports the error where it matters.
        spdlog::debug("data: prefetch of {} failed: {}", path, ex.what());
      }
    }
  }

  std::shared_ptr<s3::Client> client_;
  Manifest manifest_;
  s3::Url root_;
  RemoteCacheOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> queue_;
  int64_t bytes_ = 0;
  uint64_t clock_ = 0;
  bool stop_ = false;
  bool warned_over_ = false;
  uint64_t parts_ = 0;
  std::mutex lock_mu_;
  int lock_fd_ = -1;  // flock(2) on DIR/.lock, held while this cache lives
  RemoteCacheStats stats_;
  std::vector<std::thread> workers_;
};

}  // namespace

RemoteDataset open_remote_dataset(const std::string& url, const RemoteCacheOptions& opt,
                                  int64_t model_vocab_size, std::shared_ptr<s3::Client> client) {
  const s3::Url root = s3::parse_url(url, "data");
  if (!client) client = s3::client_from_environment();
  const s3::Url manifest_url = root.child("manifest.json");
  auto text = client->get(manifest_url, /*missing_ok=*/true);
  if (!text) {
    throw UserError("data: " + manifest_url.str() +
                    ": not found; an s3:// dataset is a prepare-data directory (moe-train "
                    "prepare-data --out s3://...), whose manifest.json is uploaded last");
  }
  RemoteDataset d;
  d.manifest = parse_manifest(*text, manifest_url.str());
  if (model_vocab_size > 0 && d.manifest.vocab_size > model_vocab_size) {
    throw UserError("data: " + manifest_url.str() + ": dataset vocab_size " +
                    std::to_string(d.manifest.vocab_size) + " exceeds model.vocab_size " +
                    std::to_string(model_vocab_size));
  }
  auto cache = std::make_shared<ShardCache>(client, d.manifest, root, opt);
  d.cache = cache;
  auto shards_of = [&](const std::string& split) {
    std::vector<ShardInfo> out;
    auto it = d.manifest.splits.find(split);
    if (it == d.manifest.splits.end()) return out;
    for (const auto& s : it->second) {
      ShardInfo info;
      info.path = cache->path_of(s.file);
      info.remote = cache;
      info.num_tokens = s.tokens;
      info.vocab_size = d.manifest.vocab_size;
      info.format_version = kShardFormatVersion;
      info.bytes_per_token = token_bytes(d.manifest.vocab_size);
      info.tokenizer = d.manifest.tokenizer;
      info.has_loss_mask = d.manifest.loss_mask;
      out.push_back(std::move(info));
    }
    return out;
  };
  d.train = shards_of("train");
  if (d.train.empty()) throw UserError("data: " + manifest_url.str() + ": no 'train' split");
  d.valid = shards_of("valid");
  return d;
}

RemoteCacheStats remote_cache_stats(const ShardFetcher& cache) {
  return dynamic_cast<const ShardCache&>(cache).stats();
}

}  // namespace moe::data

namespace moe::data {

void require_no_remote_dataset(const std::string& url, s3::Client& client) {
  const s3::Url root = s3::parse_url(url, "prepare-data --out");
  client.check_access(root);
  if (client.head(root.child("manifest.json"))) {
    throw UserError("prepare-data: " + root.child("manifest.json").str() +
                    " exists: the destination already holds a dataset; choose a new prefix or "
                    "delete the old one first");
  }
}

int64_t upload_dataset(const std::string& dir, const std::string& url, s3::Client& client) {
  const s3::Url root = s3::parse_url(url, "prepare-data --out");
  const Manifest m = load_manifest(dir);
  int64_t bytes = 0;
  for (const auto& [split, shards] : m.splits) {
    for (const auto& s : shards) {
      client.put_file(root.child(s.file), (fs::path(dir) / s.file).string());
      bytes += s.bytes;
    }
  }
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  client.put_file(root.child("manifest.json"), manifest_path);
  return bytes + static_cast<int64_t>(fs::file_size(manifest_path));
}

std::vector<ShardProblem> verify_remote_dataset(const std::string& url, const VerifyOptions& opt,
                                                const std::string& scratch_dir,
                                                s3::Client& client) {
  const s3::Url root = s3::parse_url(url, "verify-data");
  const s3::Url manifest_url = root.child("manifest.json");
  auto text = client.get(manifest_url, /*missing_ok=*/true);
  if (!text) return {{manifest_url.str(), "not found (a prepare-data directory has one)"}};
  Manifest m;
  try {
    m = parse_manifest(*text, manifest_url.str());
  } catch (const UserError& e) {
    return {{manifest_url.str(), e.what()}};
  }
  std::vector<ShardProblem> problems;
  std::error_code ec;
  fs::create_directories(scratch_dir, ec);
  if (ec) throw UserError("verify-data: " + scratch_dir + ": cannot create: " + ec.message());
  for (const auto& [split, shards] : m.splits) {
    for (const auto& s : shards) {
      const s3::Url object = root.child(s.file);
      const std::string local = (fs::path(scratch_dir) / s.file).string();
      std::string reason;
      const auto size = client.head(object);
      if (!size) {
        reason = "missing (listed in manifest.json)";
      } else if (*size != s.bytes) {
        reason =
            "size " + std::to_string(*size) + " bytes; manifest says " + std::to_string(s.bytes);
      } else {
        client.get_to_file(object, s.bytes, local);
        reason = check_shard(local, s, m, opt);
        fs::remove(local, ec);
      }
      if (!reason.empty()) problems.push_back({object.str(), reason});
    }
  }
  return problems;
}

}  // namespace moe::data
