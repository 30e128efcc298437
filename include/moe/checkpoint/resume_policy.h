// Where a training run starts: the checkpoint to resume from (an explicit --resume DIR, else
// the newest loadable one in <output_dir>/checkpoints), or step 0 with an earlier run's files
// set aside. Also the one reader of a checkpoint's state.json. No LibTorch here: loading the
// weights stays with the caller, which asks again after a checkpoint turns out unusable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/data/dataset.h"
#include "moe/optim/loss_scaler.h"

namespace spdlog {
class logger;
}

namespace moe::checkpoint {

// What the command line asked about earlier runs' files (--overwrite, --no-resume, --resume DIR).
struct ResumeRequest {
  bool overwrite = false;   // delete an earlier run's files in output_dir instead of keeping them
  bool resume = true;       // resume from <output_dir>/checkpoints/latest when there is one
  std::string resume_from;  // a specific checkpoint directory (implies resume)
};

// state.json's format_version that this build reads and writes (checkpoint_files.h's
// kCheckpointFormatVersion must equal it).
inline constexpr int64_t kStateFormatVersion = 1;

// <dir>/state.json as read from disk, before any field is looked at.
struct StateFile {
  enum class Status { kOk, kMissing, kInvalidJson };
  Status status = Status::kMissing;
  std::string path;     // <dir>/state.json, for messages
  std::string error;    // kInvalidJson: the parser's message
  nlohmann::json json;  // kOk: the whole document
};
StateFile read_state_file(const std::string& dir);

// The fields of state.json that need no LibTorch. `document` keeps the whole file for the
// parts read while loading tensors (rng, expert_biases).
struct CheckpointState {
  std::string path;  // <dir>/state.json
  int64_t step = 0;
  int64_t tokens = 0;
  data::LoaderState loader;
  optim::LossScalerState scaler;
  int64_t metrics_lines = 0;  // lines of metrics.jsonl that belong to steps <= step
  nlohmann::json config;      // the resolved config of the run that wrote it
  nlohmann::json document;
};

// Reads and checks state.json. Throws UserError "checkpoint: <dir>/state.json: ..." for a
// missing file, invalid JSON, another format_version, or a missing or mistyped field (the same
// checks and messages as load_checkpoint, in the same order).
CheckpointState read_checkpoint_state(const std::string& dir);

// The step a checkpoint holds, from its state.json; -1 when the file is missing, not JSON, or
// has no integer "step". Nothing else is checked.
int64_t peek_checkpoint_step(const std::string& dir);

struct ResumeDecision {
  enum class Action {
    kFresh,         // start at step 0; an earlier run's files are set aside
    kLoad,          // load `dir`; if that fails and `fallback`, ask again from `next_index`
    kFinished,      // `dir` holds a finished run: start at step 0 and set the earlier run aside
    kNoneLoadable,  // every candidate was unusable: throw UserError(message)
  };
  Action action = Action::kFresh;
  std::string dir;        // kLoad: the checkpoint to load; kFinished: the finished one
  bool fallback = false;  // kLoad: a failed load may try the one before (not for --resume DIR)
  size_t next_index = 0;  // kLoad: where decide_resume continues after this one failed
  int64_t step = -1;      // kFinished: the step the finished run reached
  std::string message;    // kFinished: the warning to log; kNoneLoadable: the error
  bool starts_fresh() const { return action == Action::kFresh || action == Action::kFinished; }
};

// Decides where the run starts. candidates: CheckpointStore::candidates() (best first);
// checkpoints_root: CheckpointStore::root(), for the message; first: 0, or the next_index of a
// kLoad whose checkpoint was unusable. --resume DIR is loaded as given (its errors are the
// user's, no fallback, no finished check); --no-resume and --overwrite start fresh; otherwise
// each candidate from `first` on: one that reached total_steps is a finished run, any other is
// tried. Reads only state.json (peek_checkpoint_step).
ResumeDecision decide_resume(const ResumeRequest& opt, const std::vector<std::string>& candidates,
                             int64_t total_steps, const std::string& checkpoints_root,
                             size_t first = 0);

// The error line for a candidate that failed to load: "checkpoint DIR is unusable (WHAT);
// trying the one before".
std::string unusable_checkpoint_message(const std::string& dir, const std::string& what);

// The local time as YYYYmmdd-HHMMSS: the suffix of files set aside (name.prev-STAMP).
std::string run_time_stamp(std::time_t when);

// Before a fresh run writes into `dir`: each of the files a run writes there (metrics.jsonl,
// config.json, checkpoints) that exists is renamed to NAME.prev-<stamp> (logged as a warning),
// or with `overwrite` deleted. Throws UserError when a rename fails. Returns the paths they
// were kept as (none with `overwrite`).
std::vector<std::string> set_aside_previous_run(const std::string& dir, bool overwrite,
                                                const std::string& stamp, spdlog::logger& log);

// Keeps the first `lines` lines of a metrics file (those of the steps a checkpoint covers);
// each kept line ends in a newline. A missing file is created empty.
void truncate_metrics(const std::filesystem::path& path, int64_t lines);

}  // namespace moe::checkpoint
