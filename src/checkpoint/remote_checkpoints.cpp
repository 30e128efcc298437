#include "moe/checkpoint/remote_checkpoints.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "moe/checkpoint/checkpoint_dirs.h"
#include "moe/data/checksum.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"
#include "moe/util/remove_tree.h"

namespace moe::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kChecksums = "checksums.json";

// The checkpoint's files, relative to `dir`, in a fixed order.
std::vector<std::string> files_below(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// step-NNNNNNNN -> N; -1 for anything else.
int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() != 13) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

struct RemoteCheckpoints::Impl {
  std::shared_ptr<s3::Client> client;
  s3::Url root;
  std::string local_root;
  int64_t keep_last, keep_every;
  spdlog::logger& log;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::string, int64_t>> queue;  // snapshot dir, step
  bool busy = false, stop = false;
  int64_t last_uploaded = -1;
  int64_t files_uploaded = 0;  // for MOE_TEST_DIE_IN_UPLOAD
  int64_t snapshots = 0;       // snapshot names are unique: two saves of one step may overlap
  std::thread worker;

  Impl(std::shared_ptr<s3::Client> c, s3::Url r, std::string local, int64_t kl, int64_t ke,
       spdlog::logger& l)
      : client(std::move(c)),
        root(std::move(r)),
        local_root(std::move(local)),
        keep_last(kl),
        keep_every(ke),
        log(l) {
    worker = std::thread([this] { loop(); });
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop) return;
      auto [snapshot, step] = queue.front();
      queue.pop_front();
      busy = true;
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      try {
        const int64_t bytes = upload(snapshot, step);
        {
          std::lock_guard<std::mutex> l(mu);
          last_uploaded = std::max(last_uploaded, step);
        }
        log.info("checkpoint: uploaded {} to {} ({:.1f} MiB in {:.1f} s)",
                 CheckpointStore::dir_name(step), root.str(), double(bytes) / (1 << 20),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        try {
          prune(step);
        } catch (const std::exception& e) {  // the upload stands; retention retries next time
          log.warn("checkpoint: remote retention in {} failed: {}", root.str(), e.what());
        }
      } catch (const std::exception& e) {
        // The local checkpoint is intact and the remote `latest` still names a complete one;
        // the next checkpoint tries again.
        log.error("checkpoint: upload of {} to {} failed: {}", CheckpointStore::dir_name(step),
                  root.str(), e.what());
      }
      std::error_code ec;
      remove_tree(snapshot, ec);
      lock.lock();
      busy = false;
      cv.notify_all();
    }
  }

  int64_t upload(const std::string& snapshot, int64_t step) {
    const s3::Url dir = root.child(CheckpointStore::dir_name(step));
    json sums = json::object();
    int64_t bytes = 0;
    for (const auto& rel : files_below(snapshot)) {
      const std::string path = (fs::path(snapshot) / rel).string();
      {
        std::lock_guard<std::mutex> l(mu);
        if (stop) throw std::runtime_error("abandoned (the run is exiting)");
      }
      client->put_file(dir.child(rel), path);
      const data::FileDigest d = data::digest_file(path);
      sums[rel] = {{"bytes", d.bytes}, {"xxh3", d.xxh3}};
      bytes += static_cast<int64_t>(d.bytes);
      if (++files_uploaded == fault_injection().die_in_upload) ::kill(::getpid(), SIGKILL);
    }
    client->put(dir.child(kChecksums), json{{"files", sums}}.dump(1) + "\n");
    client->put(root.child("latest"), CheckpointStore::dir_name(step) + "\n");
    return bytes;
  }

  // The remote step directories: step -> complete (has its checksums.json).
  std::map<int64_t, bool> remote_steps() {
    std::map<int64_t, bool> out;
    const std::string base = root.key.empty() ? "" : root.key + "/";
    for (const auto& o : client->list(s3::Url{root.bucket, base + "step-"})) {
      const std::string rest = o.key.substr(base.size());
      const size_t slash = rest.find('/');
      if (slash == std::string::npos) continue;
      const int64_t s = step_of(rest.substr(0, slash));
      if (s < 0) continue;
      out[s] = out[s] || rest.substr(slash + 1) == kChecksums;
    }
    return out;
  }

  // Retention as local: the newest keep_last complete ones, multiples of keep_every, the one
  // just uploaded; everything else goes, leftovers of killed uploads included. A checkpoint's
  // checksums.json goes first, so a half-deleted one never looks complete.
  void prune(int64_t just_uploaded) {
    auto steps = remote_steps();
    std::vector<int64_t> complete;
    for (const auto& [s, ok] : steps) {
      if (ok) complete.push_back(s);
    }
    std::sort(complete.rbegin(), complete.rend());
    std::set<int64_t> keep(
        complete.begin(),
        complete.begin() + std::min<size_t>(complete.size(), static_cast<size_t>(keep_last)));
    keep.insert(just_uploaded);
    for (const auto& [s, ok] : steps) {
      if (keep.count(s) != 0 || (ok && keep_every > 0 && s % keep_every == 0)) continue;
      if (!ok && s > just_uploaded) continue;  // not ours to judge: a newer upload in progress
      const s3::Url dir = root.child(CheckpointStore::dir_name(s));
      if (ok) client->remove(dir.child(kChecksums));
      for (const auto& o : client->list(s3::Url{root.bucket, dir.key + "/"})) {
        client->remove(s3::Url{root.bucket, o.key});
      }
    }
  }

  std::string restore() {
    std::vector<int64_t> order;
    if (auto latest = client->get(root.child("latest"), /*missing_ok=*/true)) {
      std::string name = *latest;
      while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
      if (step_of(name) >= 0) order.push_back(step_of(name));
    }
    auto steps = remote_steps();
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->second && (order.empty() || it->first != order.front())) order.push_back(it->first);
    }
    for (int64_t step : order) {
      try {
        return download(step);
      } catch (const TrainingError&) {
        throw;  // the store is unreachable (retries spent) or the disk failed: not the checkpoint
      } catch (const std::exception& e) {
        log.error("checkpoint: remote {} is unusable ({}); trying an older one",
                  CheckpointStore::dir_name(step), e.what());
      }
    }
    return "";
  }

  std::string download(int64_t step) {
    const std::string name = CheckpointStore::dir_name(step);
    const s3::Url dir = root.child(name);
    auto text = client->get(dir.child(kChecksums), /*missing_ok=*/true);
    if (!text) throw UserError(dir.child(kChecksums).str() + ": missing (an incomplete upload)");
    json sums;
    try {
      sums = json::parse(*text).at("files");
    } catch (const json::exception& e) {
      throw UserError(dir.child(kChecksums).str() + ": " + e.what());
    }
    if (!sums.is_object())
      throw UserError(dir.child(kChecksums).str() + ": 'files' is not an object");
    CheckpointStore store(local_root);
    const std::string tmp = store.begin(step);
    try {
      for (const auto& [rel, want] : sums.items()) {
        if (rel.empty() || rel.find("..") != std::string::npos || rel.front() == '/' ||
            !want.is_object() || !want.contains("bytes") || !want.contains("xxh3") ||
            !want["bytes"].is_number_integer() || !want["xxh3"].is_string()) {
          throw UserError(dir.child(kChecksums).str() + ": bad entry '" + rel +
                          "' (expected a relative name with bytes and xxh3)");
        }
        const fs::path local = fs::path(tmp) / rel;
        fs::create_directories(local.parent_path());
        const int64_t size = want.at("bytes").get<int64_t>();
        client->get_to_file(dir.child(rel), size, local.string());
        const data::FileDigest d = data::digest_file(local.string());
        if (d.xxh3 != want.at("xxh3").get<std::string>()) {
          throw UserError(dir.child(rel).str() + ": xxh3 " + d.xxh3 + " does not match " +
                          kChecksums + "'s " + want.at("xxh3").get<std::string>());
        }
      }
      // keep_last = huge: restoring never prunes anything local.
      const std::string out = store.commit(tmp, step, INT64_MAX / 2, 0);
      log.info("checkpoint: no local checkpoint; restored {} from {} ({} files, verified)", name,
               root.str(), sums.size());
      return out;
    } catch (...) {
      std::error_code ec;
      remove_tree(tmp, ec);
      throw;
    }
  }
};

RemoteCheckpoints::RemoteCheckpoints(std::shared_ptr<s3::Client> client, s3::Url root,
                                     std::string local_root, int64_t keep_last, int64_t keep_every,
                                     spdlog::logger& log)
    : impl_(std::make_unique<Impl>(std::move(client), std::move(root), std::move(local_root),
                                   keep_last, keep_every, log)) {}

RemoteCheckpoints::~RemoteCheckpoints() {
  impl_->client->abort();  // an upload in flight ends now, not after its last part
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    for (auto& [snapshot, step] : impl_->queue) {
      std::error_code ec;
      remove_tree(snapshot, ec);
    }
    impl_->queue.clear();
  }
  impl_->cv.notify_all();
  impl_->worker.join();
  impl_->log.info("checkpoint: uploads to {}: {} requests retried", impl_->root.str(),
                  impl_->client->retries());
}

void RemoteCheckpoints::enqueue(const std::string& dir, int64_t step) {
  // Hard links: the same bytes, immune to local retention removing `dir` before the upload.
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    seq = ++impl_->snapshots;
  }
  const fs::path snapshot =
      fs::path(impl_->local_root) /
      (".upload-" + CheckpointStore::dir_name(step) + "-" + std::to_string(seq));
  std::error_code ec;
  remove_tree(snapshot, ec);
  for (const auto& rel : files_below(dir)) {
    const fs::path to = snapshot / rel;
    fs::create_directories(to.parent_path());
    fs::create_hard_link(fs::path(dir) / rel, to, ec);
    if (ec) fs::copy_file(fs::path(dir) / rel, to, fs::copy_options::overwrite_existing);
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->queue.emplace_back(snapshot.string(), step);
  impl_->cv.notify_all();
}

bool RemoteCheckpoints::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                            [&] { return impl_->queue.empty() && !impl_->busy; });
}

int64_t RemoteCheckpoints::last_uploaded() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_uploaded;
}

std::string RemoteCheckpoints::restore() { return impl_->restore(); }

}  // namespace moe::checkpoint
