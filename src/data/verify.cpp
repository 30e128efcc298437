#include "moe/data/verify.h"

#include <filesystem>
#include <future>

#include "moe/data/checksum.h"
#include "moe/util/errors.h"

namespace moe::data {

namespace fs = std::filesystem;

std::string check_shard(const std::string& path, const ManifestShard& s, const Manifest& m,
                        const VerifyOptions& opt) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "missing (listed in manifest.json)";
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (size != s.bytes) {
    return "size " + std::to_string(size) + " bytes; manifest says " + std::to_string(s.bytes) +
           (size < s.bytes ? " (truncated)" : "");
  }
  // Checksums first: a tampered or damaged file is rejected before libhdf5 parses it
  // (libhdf5 1.10.8 has memory-safety bugs on malformed files; docs/reliability.md).
  if (opt.checksums) {
    FileDigest d = digest_file(path);
    if (d.md5 != s.md5) return "md5 " + d.md5 + " does not match manifest " + s.md5;
    if (!s.xxh3.empty() && d.xxh3 != s.xxh3) {
      return "xxh3 " + d.xxh3 + " does not match manifest " + s.xxh3;
    }
  }
  ShardInfo info;
  try {
    info = inspect_shard(path);
  } catch (const UserError& e) {
    std::string what = e.what();
    const std::string prefix = "data: " + path + ": ";
    return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
  }
  if (info.num_tokens != s.tokens) {
    return "holds " + std::to_string(info.num_tokens) + " tokens; manifest says " +
           std::to_string(s.tokens);
  }
  if (info.vocab_size != m.vocab_size) {
    return "vocab_size attribute " + std::to_string(info.vocab_size) + "; manifest says " +
           std::to_string(m.vocab_size);
  }
  if (s.max_token >= m.vocab_size) {
    return "max_token " + std::to_string(s.max_token) + " >= vocab_size " +
           std::to_string(m.vocab_size);
  }
  if (opt.model_vocab_size > 0 && m.vocab_size > opt.model_vocab_size) {
    return "dataset vocab_size " + std::to_string(m.vocab_size) + " exceeds model.vocab_size " +
           std::to_string(opt.model_vocab_size);
  }
  return "";
}

std::vector<ShardProblem> verify_dataset(const std::string& dir, const VerifyOptions& opt) {
  std::vector<ShardProblem> problems;
  Manifest m;
  try {
    m = load_manifest(dir);
  } catch (const UserError& e) {
    return {{(fs::path(dir) / "manifest.json").string(), e.what()}};
  }
  struct Job {
    std::string path;
    std::future<std::string> result;
  };
  std::vector<Job> jobs;
  auto drain = [&](size_t keep) {
    while (jobs.size() > keep) {
      std::string r = jobs.front().result.get();
      if (!r.empty()) problems.push_back({jobs.front().path, r});
      jobs.erase(jobs.begin());
    }
  };
  for (const auto& [split, shards] : m.splits) {
    for (const auto& s : shards) {
      std::string path = (fs::path(dir) / s.file).string();
      jobs.push_back({path, std::async(std::launch::async, [path, s, &m, &opt] {
                        return check_shard(path, s, m, opt);
                      })});
      drain(static_cast<size_t>(std::max(1, opt.threads)) - 1);
    }
  }
  drain(0);
  return problems;
}

std::vector<ShardInfo> open_split(const std::string& dir, const std::string& split,
                                  int64_t model_vocab_size, bool checksums) {
  Manifest m = load_manifest(dir);
  auto it = m.splits.find(split);
  if (it == m.splits.end() || it->second.empty()) {
    throw UserError("data: " + (fs::path(dir) / "manifest.json").string() + ": no '" + split +
                    "' split");
  }
  VerifyOptions opt;
  opt.checksums = checksums;
  opt.model_vocab_size = model_vocab_size;
  std::vector<ShardInfo> out;
  for (const auto& s : it->second) {
    std::string path = (fs::path(dir) / s.file).string();
    std::string r = check_shard(path, s, m, opt);
    if (!r.empty()) throw UserError("data: " + path + ": " + r);
    out.push_back(inspect_shard(path));
  }
  return out;
}

}  // namespace moe::data
