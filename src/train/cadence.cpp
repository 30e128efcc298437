#include "moe/train/cadence.h"

#include <csignal>

namespace moe::train {

const char* to_string(SaveReason reason) {
  switch (reason) {
    case SaveReason::kNone:
      return "none";
    case SaveReason::kInitial:
      return "initial";
    case SaveReason::kFinal:
      return "final";
    case SaveReason::kInterval:
      return "interval";
    case SaveReason::kTime:
      return "time";
    case SaveReason::kSigusr1:
      return "SIGUSR1";
    case SaveReason::kExitInterval:
      return "exit_interval";
    case SaveReason::kSigterm:
      return "SIGTERM";
    case SaveReason::kSigint:
      return "SIGINT";
  }
  return "none";
}

CadenceOptions CadenceOptions::from_config(const config::Config& cfg) {
  CadenceOptions o;
  o.eval_interval = cfg.training.eval_interval;
  o.save_interval = cfg.checkpoint.save_interval;
  o.save_interval_minutes = cfg.checkpoint.save_interval_minutes;
  o.save_initial = cfg.checkpoint.save_initial;
  o.save_final = cfg.checkpoint.save_final;
  o.exit_interval = cfg.training.exit_interval;
  o.exit_duration_minutes = cfg.training.exit_duration_minutes;
  return o;
}

Cadence::Cadence(const CadenceOptions& opt, int64_t total_steps, bool has_validation)
    : opt_(opt), total_steps_(total_steps), has_validation_(has_validation) {}

Actions Cadence::before_first_step(bool resumed) const {
  Actions a;
  // A resumed run validated and saved its start in the run it continues.
  if (resumed) return a;
  a.evaluate = has_validation_;
  if (should_save_initial(resumed)) a.save = SaveReason::kInitial;
  return a;
}

bool Cadence::after_step_evaluate(int64_t step) const {
  return has_validation_ &&
         (is_last(step) || (opt_.eval_interval > 0 && step % opt_.eval_interval == 0));
}

SaveReason Cadence::after_step_save(int64_t step, double minutes_since_save,
                                    bool checkpoint_requested) const {
  if (is_last(step) && opt_.save_final) return SaveReason::kFinal;
  if (opt_.save_interval > 0 && step % opt_.save_interval == 0) return SaveReason::kInterval;
  if (opt_.save_interval_minutes > 0 && minutes_since_save >= opt_.save_interval_minutes) {
    return SaveReason::kTime;
  }
  // Checked last: a request is only consumed when no other reason saved this step.
  if (checkpoint_requested) return SaveReason::kSigusr1;
  return SaveReason::kNone;
}

StopReason Cadence::after_step_stop(int64_t step, double run_minutes, int stop_signal) const {
  // At the last step the run ends normally (its final checkpoint, if any, is already written).
  if (is_last(step)) return StopReason::kNone;
  if (opt_.exit_interval > 0 && step % opt_.exit_interval == 0) return StopReason::kExitInterval;
  if (opt_.exit_duration_minutes > 0 && run_minutes >= opt_.exit_duration_minutes) {
    return StopReason::kExitDuration;
  }
  if (stop_signal != 0) return StopReason::kSignal;
  return StopReason::kNone;
}

SaveReason Cadence::save_reason(StopReason stop, int stop_signal) {
  switch (stop) {
    case StopReason::kNone:
      return SaveReason::kNone;
    case StopReason::kExitInterval:
    case StopReason::kExitDuration:
      return SaveReason::kExitInterval;
    case StopReason::kSignal:
      // Any stop signal other than SIGTERM is reported as SIGINT (the two that stop the run).
      return stop_signal == SIGTERM ? SaveReason::kSigterm : SaveReason::kSigint;
  }
  return SaveReason::kNone;
}

Actions Cadence::after_step(const StepInputs& in) const {
  Actions a;
  a.evaluate = after_step_evaluate(in.step);
  a.save = after_step_save(in.step, in.minutes_since_save, in.checkpoint_requested);
  a.stop = after_step_stop(in.step, in.run_minutes, in.stop_signal);
  a.stop_save = save_reason(a.stop, in.stop_signal);
  return a;
}

}  // namespace moe::train
