#include "moe/checkpoint/checkpoint_dirs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::checkpoint {

namespace fs = std::filesystem;

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw TrainingError("checkpoint: " + path + ": cannot open for fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    throw TrainingError("checkpoint: " + path + ": fsync failed: " + std::strerror(errno));
}

CheckpointStore::CheckpointStore(std::string root) : root_(std::move(root)) {}

std::string CheckpointStore::dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

void CheckpointStore::clean_partial() const {
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    // .upload-*: hard-linked snapshots of a checkpoint.remote upload that did not finish.
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".upload-", 0) == 0 || name == "latest.tmp") {
      remove_tree(e.path(), ec);
    }
  }
}

std::string CheckpointStore::begin(int64_t step) const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw TrainingError("checkpoint: " + root_ + ": cannot create: " + ec.message());
  const fs::path tmp = fs::path(root_) / (".tmp-" + dir_name(step));
  remove_tree(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw TrainingError("checkpoint: " + tmp.string() + ": cannot create: " + ec.message());
  return tmp.string();
}

std::string CheckpointStore::commit(const std::string& tmp, int64_t step, int64_t keep_last,
                                    int64_t keep_every) const {
  for (const auto& e : fs::directory_iterator(tmp)) fsync_path(e.path().string());
  fsync_path(tmp);
  const fs::path final_dir = fs::path(root_) / dir_name(step);
  std::error_code ec;
  remove_tree(final_dir, ec);  // a checkpoint of the same step from a run being replayed
  fs::rename(tmp, final_dir, ec);
  if (ec)
    throw TrainingError("checkpoint: cannot rename " + tmp + " to " + final_dir.string() + ": " +
                        ec.message());
  fsync_path(root_);
  // Point `latest` at it: a whole new file renamed over the old one.
  const fs::path latest_tmp = fs::path(root_) / "latest.tmp";
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << dir_name(step) << "\n";
    out.flush();
    if (!out) throw TrainingError("checkpoint: " + latest_tmp.string() + ": write failed");
  }
  fsync_path(latest_tmp.string());
  fs::rename(latest_tmp, fs::path(root_) / "latest", ec);
  if (ec) throw TrainingError("checkpoint: cannot update latest: " + ec.message());
  fsync_path(root_);

  // Retention.
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) {
      steps.emplace_back(std::stoll(name.substr(5)), e.path());
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(keep_last); i < steps.size(); ++i) {
    const int64_t s = steps[i].first;
    if (s == step || (keep_every > 0 && s % keep_every == 0)) continue;
    remove_tree(steps[i].second, ec);
  }
  return final_dir.string();
}

std::vector<std::string> CheckpointStore::candidates() const {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  std::ifstream latest(fs::path(root_) / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && name.rfind("step-", 0) == 0 &&
      name.find('/') == std::string::npos) {
    out.push_back((fs::path(root_) / name).string());
  }
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0) steps.push_back(e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& s : steps) {
    if (out.empty() || s != out.front()) out.push_back(s);
  }
  return out;
}

}  // namespace moe::checkpoint
