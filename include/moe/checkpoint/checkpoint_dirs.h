// Checkpoint directories under <output_dir>/checkpoints: each checkpoint is written into a
// temporary directory, its files fsynced, then renamed to step-NNNNNNNN (atomic on POSIX), and
// only then the `latest` pointer is replaced (write latest.tmp, fsync, rename). A crash at any
// moment leaves `latest` naming a complete checkpoint. Retention: the newest keep_last, plus
// every step that is a multiple of keep_every.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::checkpoint {

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string root);
  const std::string& root() const { return root_; }
  // Removes temporary directories that an interrupted write left behind.
  void clean_partial() const;
  // A new, empty temporary directory for the checkpoint of `step`.
  std::string begin(int64_t step) const;
  // Publishes the temporary directory as the checkpoint of `step`, moves `latest`, prunes.
  // Returns the final directory.
  std::string commit(const std::string& tmp, int64_t step, int64_t keep_last,
                     int64_t keep_every) const;
  // Completed checkpoints to try on resume, best first: `latest`, then the others by step.
  std::vector<std::string> candidates() const;
  static std::string dir_name(int64_t step);

 private:
  std::string root_;
};

// fsync a file or directory by path; throws TrainingError on failure.
void fsync_path(const std::string& path);

}  // namespace moe::checkpoint
