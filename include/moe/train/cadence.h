// When the training loop validates, writes a checkpoint and stops: the decisions of the
// `training.*` and `checkpoint.*` settings, signals and the run's length, as plain functions of
// numbers. No clocks or signal handlers inside: the loop measures the times and reads the
// signal flags, and passes them in.
//
// Order at the end of step N (1-based, N = total_steps is the last step):
//   1. validate                    after_step_evaluate(N)
//   2. (loop measures the minutes since the last successful checkpoint, after the validation)
//   3. at most one checkpoint      after_step_save(N, minutes_since_save, checkpoint_requested)
//   4. (loop measures the minutes since the loop started, after that checkpoint)
//   5. stop, with its checkpoint   after_step_stop(N, run_minutes, stop_signal)
// A step can write two checkpoints: one of 3. and the one of a stop in 5.
#pragma once

#include <cstdint>

#include "moe/config/config.h"

namespace moe::train {

// Why a checkpoint is written; to_string gives the word the log line "checkpoint (WHY): DIR"
// shows.
enum class SaveReason {
  kNone,
  kInitial,       // "initial": the weights before step 1 (checkpoint.save_initial)
  kFinal,         // "final": after the last step (checkpoint.save_final)
  kInterval,      // "interval": every checkpoint.save_interval steps
  kTime,          // "time": checkpoint.save_interval_minutes since the last checkpoint
  kSigusr1,       // "SIGUSR1": a checkpoint was requested; the run continues
  kExitInterval,  // "exit_interval": before stopping at exit_interval or exit_duration_minutes
  kSigterm,       // "SIGTERM": before stopping on SIGTERM
  kSigint,        // "SIGINT": before stopping on SIGINT
};
const char* to_string(SaveReason reason);

// Why the loop ends before the last step (each writes a checkpoint first: save_reason()).
enum class StopReason {
  kNone,
  kExitInterval,  // the step is a multiple of training.exit_interval
  kExitDuration,  // training.exit_duration_minutes have passed since the loop started
  kSignal,        // SIGTERM or SIGINT arrived
};

struct Actions {
  bool evaluate = false;                // validate (eval record of this step)
  SaveReason save = SaveReason::kNone;  // the checkpoint of this step, if any
  StopReason stop = StopReason::kNone;  // stop after this step (its checkpoint: stop_save)
  SaveReason stop_save = SaveReason::kNone;
  // The pending checkpoint request (SIGUSR1) is served by `save`: clear the flag. A request
  // not served (another reason saved this step) stays pending for the next step.
  bool consumes_checkpoint_request() const { return save == SaveReason::kSigusr1; }
};

// The settings the decisions read, from the config.
struct CadenceOptions {
  int64_t eval_interval = 0;         // training.eval_interval; 0 = only step 0 and the end
  int64_t save_interval = 0;         // checkpoint.save_interval; 0 = off
  double save_interval_minutes = 0;  // checkpoint.save_interval_minutes; 0 = off
  bool save_initial = false;         // checkpoint.save_initial
  bool save_final = true;            // checkpoint.save_final
  int64_t exit_interval = 0;         // training.exit_interval; 0 = off
  double exit_duration_minutes = 0;  // training.exit_duration_minutes; 0 = off

  static CadenceOptions from_config(const config::Config& cfg);
};

// What a step's end needs from the loop; times in minutes (see the order above for when each
// is measured). Before the first successful checkpoint, minutes_since_save counts from just
// before the step-0 validation; a failed checkpoint (on_failure = continue) does not reset it.
struct StepInputs {
  int64_t step = 0;                   // the step just completed, 1-based
  double minutes_since_save = 0.0;    // since the last successful checkpoint (see above)
  double run_minutes = 0.0;           // since the training loop started
  bool checkpoint_requested = false;  // SIGUSR1 pending
  int stop_signal = 0;                // SIGTERM or SIGINT when one arrived, else 0
};

class Cadence {
 public:
  // total_steps: the run's optimizer steps; has_validation: there is validation data.
  Cadence(const CadenceOptions& opt, int64_t total_steps, bool has_validation);

  // Before step 1 of a fresh run (nothing for a resumed one): validate at step 0 whenever there
  // is validation data (eval_interval does not matter), then checkpoint.save_initial.
  Actions before_first_step(bool resumed) const;
  bool should_save_initial(bool resumed) const { return !resumed && opt_.save_initial; }

  // 1. Validate after `step`: at the last step and every eval_interval steps.
  bool after_step_evaluate(int64_t step) const;
  // 3. At most one checkpoint, first match wins: final (last step, save_final), interval, time,
  //    SIGUSR1. The last step is saved once: save_final takes it before any other reason.
  SaveReason after_step_save(int64_t step, double minutes_since_save,
                             bool checkpoint_requested) const;
  // 5. Stop before the last step (never at it: the run ends there anyway): exit_interval, then
  //    exit_duration_minutes, then a stop signal. Each stop writes a checkpoint even when 3. just
  //    wrote one of the same step.
  StopReason after_step_stop(int64_t step, double run_minutes, int stop_signal) const;
  // The checkpoint a stop writes: exit_interval for both exits, else SIGTERM or SIGINT.
  static SaveReason save_reason(StopReason stop, int stop_signal);

  // 1., 3. and 5. at once, for callers that take both times at the same moment.
  Actions after_step(const StepInputs& in) const;

  bool is_last(int64_t step) const { return step == total_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  CadenceOptions opt_;
  int64_t total_steps_;
  bool has_validation_;
};

}  // namespace moe::train
