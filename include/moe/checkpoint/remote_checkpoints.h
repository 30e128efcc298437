// checkpoint.remote = "s3://bucket/prefix": every completed local checkpoint is mirrored there by
// a background thread, so a Spot instance whose local disk disappears can resume elsewhere.
//
// Remote layout, mirroring <output_dir>/checkpoints:
//   PREFIX/step-NNNNNNNN/<the checkpoint's files>
//   PREFIX/step-NNNNNNNN/checksums.json   (bytes and xxh3 of each file; uploaded after them)
//   PREFIX/latest                          ("step-NNNNNNNN"; uploaded last)
// A checkpoint counts as complete only with its checksums.json, and `latest` only ever names a
// complete one, so an upload killed at any moment is never resumed from. Retention mirrors the
// local one (keep_last, keep_every) and removes incomplete leftovers too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moe/util/s3_client.h"

namespace spdlog {
class logger;
}

namespace moe::checkpoint {

class RemoteCheckpoints {
 public:
  RemoteCheckpoints(std::shared_ptr<s3::Client> client, s3::Url root, std::string local_root,
                    int64_t keep_last, int64_t keep_every, spdlog::logger& log);
  // Abandons queued uploads (the remote `latest` still names a complete checkpoint).
  ~RemoteCheckpoints();
  RemoteCheckpoints(const RemoteCheckpoints&) = delete;
  RemoteCheckpoints& operator=(const RemoteCheckpoints&) = delete;

  // Queues the committed checkpoint `dir` (of `step`) for upload and returns at once. Its files
  // are hard-linked into a snapshot first, so local retention may prune `dir` meanwhile.
  void enqueue(const std::string& dir, int64_t step);
  // Waits until every queued upload has finished (or failed, which is logged), at most
  // `timeout_s`. Returns true when nothing is left.
  bool wait(double timeout_s);
  // The newest step whose upload completed (-1: none yet).
  int64_t last_uploaded() const;

  // With no local checkpoint: downloads the newest complete remote one (`latest`, else the
  // newest with a checksums.json) into local_root as step-N with a `latest` pointer, verifying
  // every file's size and xxh3. Returns its directory, or "" when the remote holds none.
  std::string restore();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::checkpoint
