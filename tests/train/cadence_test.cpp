// When the loop validates, checkpoints and stops: each rule by hand, then every combination of
// settings, steps, times and signals against a transcription of the training loop's own
// if-chains (the behaviour the cadence must keep).
#include "moe/train/cadence.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <utility>
#include <vector>

namespace moe::train {
namespace {

CadenceOptions none() {
  CadenceOptions o;
  o.save_final = false;
  return o;
}

TEST(Cadence, FromConfigTakesTheTrainingAndCheckpointKeys) {
  config::Config cfg;
  cfg.training.eval_interval = 7;
  cfg.training.exit_interval = 11;
  cfg.training.exit_duration_minutes = 2.5;
  cfg.checkpoint.save_interval = 5;
  cfg.checkpoint.save_interval_minutes = 1.5;
  cfg.checkpoint.save_initial = true;
  cfg.checkpoint.save_final = false;
  const CadenceOptions o = CadenceOptions::from_config(cfg);
  EXPECT_EQ(o.eval_interval, 7);
  EXPECT_EQ(o.exit_interval, 11);
  EXPECT_EQ(o.exit_duration_minutes, 2.5);
  EXPECT_EQ(o.save_interval, 5);
  EXPECT_EQ(o.save_interval_minutes, 1.5);
  EXPECT_TRUE(o.save_initial);
  EXPECT_FALSE(o.save_final);
  // The config's defaults: validation every 100 steps, a final checkpoint, nothing else.
  const CadenceOptions d = CadenceOptions::from_config(config::Config{});
  EXPECT_EQ(d.eval_interval, 100);
  EXPECT_EQ(d.save_interval, 0);
  EXPECT_EQ(d.save_interval_minutes, 0.0);
  EXPECT_FALSE(d.save_initial);
  EXPECT_TRUE(d.save_final);
  EXPECT_EQ(d.exit_interval, 0);
  EXPECT_EQ(d.exit_duration_minutes, 0.0);
}

TEST(Cadence, ReasonWordsAreTheLoggedOnes) {
  EXPECT_STREQ(to_string(SaveReason::kInitial), "initial");
  EXPECT_STREQ(to_string(SaveReason::kFinal), "final");
  EXPECT_STREQ(to_string(SaveReason::kInterval), "interval");
  EXPECT_STREQ(to_string(SaveReason::kTime), "time");
  EXPECT_STREQ(to_string(SaveReason::kSigusr1), "SIGUSR1");
  EXPECT_STREQ(to_string(SaveReason::kExitInterval), "exit_interval");
  EXPECT_STREQ(to_string(SaveReason::kSigterm), "SIGTERM");
  EXPECT_STREQ(to_string(SaveReason::kSigint), "SIGINT");
  EXPECT_STREQ(to_string(SaveReason::kNone), "none");
}

TEST(Cadence, FreshRunValidatesAtStepZeroWhateverTheInterval) {
  CadenceOptions o = none();
  o.eval_interval = 0;
  EXPECT_TRUE(Cadence(o, 10, true).before_first_step(false).evaluate);
  EXPECT_FALSE(Cadence(o, 10, false).before_first_step(false).evaluate);  // no validation data
  EXPECT_FALSE(Cadence(o, 10, true).before_first_step(true).evaluate);    // resumed
}

TEST(Cadence, InitialCheckpointOnlyForAFreshRunThatAsksForIt) {
  CadenceOptions o = none();
  EXPECT_EQ(Cadence(o, 10, true).before_first_step(false).save, SaveReason::kNone);
  o.save_initial = true;
  const Cadence c(o, 10, false);
  EXPECT_EQ(c.before_first_step(false).save, SaveReason::kInitial);
  EXPECT_TRUE(c.should_save_initial(false));
  EXPECT_EQ(c.before_first_step(true).save, SaveReason::kNone);
  EXPECT_FALSE(c.should_save_initial(true));
  EXPECT_EQ(c.before_first_step(false).stop, StopReason::kNone);
}

TEST(Cadence, ValidatesEveryIntervalAndAtTheEnd) {
  CadenceOptions o = none();
  o.eval_interval = 4;
  const Cadence c(o, 10, true);
  std::vector<int64_t> at;
  for (int64_t s = 1; s <= 10; ++s)
    if (c.after_step_evaluate(s)) at.push_back(s);
  EXPECT_EQ(at, (std::vector<int64_t>{4, 8, 10}));
  // eval_interval 0: only the end (and step 0, above).
  o.eval_interval = 0;
  const Cadence end_only(o, 10, true);
  at.clear();
  for (int64_t s = 1; s <= 10; ++s)
    if (end_only.after_step_evaluate(s)) at.push_back(s);
  EXPECT_EQ(at, (std::vector<int64_t>{10}));
  // No validation data: never.
  o.eval_interval = 1;
  const Cadence no_data(o, 10, false);
  for (int64_t s = 1; s <= 10; ++s) EXPECT_FALSE(no_data.after_step_evaluate(s)) << s;
}

TEST(Cadence, SavesEveryIntervalAndOnceAtTheEnd) {
  CadenceOptions o = none();
  o.save_interval = 5;
  o.save_final = true;
  const Cadence c(o, 10, false);
  EXPECT_EQ(c.after_step_save(4, 0, false), SaveReason::kNone);
  EXPECT_EQ(c.after_step_save(5, 0, false), SaveReason::kInterval);
  // Step 10 is both a multiple and the last step: one checkpoint, "final".
  EXPECT_EQ(c.after_step_save(10, 0, false), SaveReason::kFinal);
  // Without save_final the last step still saves when it is a multiple.
  o.save_final = false;
  EXPECT_EQ(Cadence(o, 10, false).after_step_save(10, 0, false), SaveReason::kInterval);
  EXPECT_EQ(Cadence(o, 11, false).after_step_save(11, 0, false), SaveReason::kNone);
  // save_final alone: only the last step.
  o.save_interval = 0;
  o.save_final = true;
  const Cadence final_only(o, 3, false);
  EXPECT_EQ(final_only.after_step_save(1, 1e9, false), SaveReason::kNone);
  EXPECT_EQ(final_only.after_step_save(3, 0, false), SaveReason::kFinal);
}

TEST(Cadence, SavesAfterEnoughMinutes) {
  CadenceOptions o = none();
  o.save_interval_minutes = 2.0;
  const Cadence c(o, 100, false);
  EXPECT_EQ(c.after_step_save(1, 1.999, false), SaveReason::kNone);
  EXPECT_EQ(c.after_step_save(1, 2.0, false), SaveReason::kTime);  // reached counts
  // Interval first when both hold.
  o.save_interval = 3;
  EXPECT_EQ(Cadence(o, 100, false).after_step_save(3, 5.0, false), SaveReason::kInterval);
  // 0 minutes = off, however long it has been.
  EXPECT_EQ(Cadence(none(), 100, false).after_step_save(1, 1e9, false), SaveReason::kNone);
}

TEST(Cadence, CheckpointRequestIsServedWhenNothingElseSaves) {
  CadenceOptions o = none();
  o.save_interval = 2;
  const Cadence c(o, 10, false);
  Actions a = c.after_step({.step = 1, .checkpoint_requested = true});
  EXPECT_EQ(a.save, SaveReason::kSigusr1);
  EXPECT_TRUE(a.consumes_checkpoint_request());
  EXPECT_EQ(a.stop, StopReason::kNone);  // SIGUSR1 continues
  // An interval save at the same step leaves the request pending: the next step saves again.
  a = c.after_step({.step = 2, .checkpoint_requested = true});
  EXPECT_EQ(a.save, SaveReason::kInterval);
  EXPECT_FALSE(a.consumes_checkpoint_request());
  EXPECT_EQ(c.after_step({.step = 3, .checkpoint_requested = true}).save, SaveReason::kSigusr1);
  // At the last step it is served only when save_final does not save.
  CadenceOptions f = none();
  f.save_final = true;
  EXPECT_EQ(Cadence(f, 3, false).after_step_save(3, 0, true), SaveReason::kFinal);
  EXPECT_EQ(Cadence(none(), 3, false).after_step_save(3, 0, true), SaveReason::kSigusr1);
}

TEST(Cadence, ExitIntervalStopsWithACheckpointBeforeTheEnd) {
  CadenceOptions o = none();
  o.exit_interval = 4;
  const Cadence c(o, 8, false);
  EXPECT_EQ(c.after_step_stop(3, 0, 0), StopReason::kNone);
  EXPECT_EQ(c.after_step_stop(4, 0, 0), StopReason::kExitInterval);
  EXPECT_EQ(Cadence::save_reason(StopReason::kExitInterval, 0), SaveReason::kExitInterval);
  // The last step is never a stop: the run ends there with its own checkpoint.
  EXPECT_EQ(c.after_step_stop(8, 0, 0), StopReason::kNone);
}

TEST(Cadence, ExitDurationCountsFromTheLoopStart) {
  CadenceOptions o = none();
  o.exit_duration_minutes = 10;
  const Cadence c(o, 100, false);
  EXPECT_EQ(c.after_step_stop(5, 9.99, 0), StopReason::kNone);
  EXPECT_EQ(c.after_step_stop(5, 10.0, 0), StopReason::kExitDuration);
  EXPECT_EQ(Cadence::save_reason(StopReason::kExitDuration, 0), SaveReason::kExitInterval);
  EXPECT_EQ(c.after_step_stop(100, 1e9, 0), StopReason::kNone);
}

TEST(Cadence, StopSignalsCheckpointAndStopBeforeTheEnd) {
  const Cadence c(none(), 10, false);
  EXPECT_EQ(c.after_step_stop(3, 0, SIGTERM), StopReason::kSignal);
  EXPECT_EQ(Cadence::save_reason(StopReason::kSignal, SIGTERM), SaveReason::kSigterm);
  EXPECT_EQ(Cadence::save_reason(StopReason::kSignal, SIGINT), SaveReason::kSigint);
  // Only SIGTERM is named as itself; any other stop signal is reported as SIGINT.
  EXPECT_EQ(Cadence::save_reason(StopReason::kSignal, SIGHUP), SaveReason::kSigint);
  // At the last step a signal changes nothing: no extra checkpoint, not "interrupted".
  const Actions last = c.after_step({.step = 10, .stop_signal = SIGTERM});
  EXPECT_EQ(last.stop, StopReason::kNone);
  EXPECT_EQ(last.stop_save, SaveReason::kNone);
  EXPECT_EQ(last.save, SaveReason::kNone);  // save_final off
}

TEST(Cadence, ExitWinsOverASignalAtTheSameStep) {
  CadenceOptions o = none();
  o.exit_interval = 2;
  const Actions a = Cadence(o, 10, false).after_step({.step = 2, .stop_signal = SIGINT});
  EXPECT_EQ(a.stop, StopReason::kExitInterval);
  EXPECT_EQ(a.stop_save, SaveReason::kExitInterval);
}

TEST(Cadence, AStopAfterAnIntervalSaveWritesTheStepTwice) {
  CadenceOptions o = none();
  o.save_interval = 5;
  o.exit_interval = 5;
  const Actions a = Cadence(o, 20, true).after_step({.step = 5, .stop_signal = SIGTERM});
  EXPECT_FALSE(a.evaluate);  // eval_interval 0
  EXPECT_EQ(a.save, SaveReason::kInterval);
  EXPECT_EQ(a.stop, StopReason::kExitInterval);
  EXPECT_EQ(a.stop_save, SaveReason::kExitInterval);
}

// ---- the loop's end-of-step code as it was written in run_training, for comparison ----

struct Event {
  std::vector<std::string> saves;  // in order
  bool evaluated = false;
  bool stopped = false;
  bool request_left = false;  // SIGUSR1 still pending afterwards
  bool operator==(const Event&) const = default;
};

Event legacy_end_of_step(const CadenceOptions& cfg, bool has_valid, int64_t step,
                         int64_t total_steps, double minutes, double run_minutes, bool request,
                         int stop_signal) {
  Event e;
  auto save = [&](const char* why) { e.saves.push_back(why); };
  const bool last = step + 1 == total_steps;
  if (has_valid && (last || (cfg.eval_interval > 0 && (step + 1) % cfg.eval_interval == 0))) {
    e.evaluated = true;
  }
  if (last && cfg.save_final) {
    save("final");
  } else if (cfg.save_interval > 0 && (step + 1) % cfg.save_interval == 0) {
    save("interval");
  } else if (cfg.save_interval_minutes > 0 && minutes >= cfg.save_interval_minutes) {
    save("time");
  } else if (std::exchange(request, false)) {
    save("SIGUSR1");
  }
  const bool exit_now =
      !last && ((cfg.exit_interval > 0 && (step + 1) % cfg.exit_interval == 0) ||
                (cfg.exit_duration_minutes > 0 && run_minutes >= cfg.exit_duration_minutes));
  if (exit_now) {
    save("exit_interval");
    e.stopped = true;
  } else if (stop_signal != 0 && !last) {
    save(stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
    e.stopped = true;
  }
  e.request_left = request;
  return e;
}

Event cadence_end_of_step(const Cadence& c, int64_t step, double minutes, double run_minutes,
                          bool request, int stop_signal) {
  Event e;
  const Actions a = c.after_step({.step = step + 1,
                                  .minutes_since_save = minutes,
                                  .run_minutes = run_minutes,
                                  .checkpoint_requested = request,
                                  .stop_signal = stop_signal});
  e.evaluated = a.evaluate;
  if (a.save != SaveReason::kNone) e.saves.push_back(to_string(a.save));
  if (a.stop != StopReason::kNone) {
    e.saves.push_back(to_string(a.stop_save));
    e.stopped = true;
  }
  e.request_left = request && !a.consumes_checkpoint_request();
  return e;
}

TEST(Cadence, SameDecisionsAsTheTrainingLoopForEveryCombination) {
  int compared = 0;
  for (int64_t total : {1, 6, 12}) {
    for (int64_t eval_interval : {0, 1, 4}) {
      for (int64_t save_interval : {0, 1, 3}) {
        for (double save_minutes : {0.0, 1.0}) {
          for (int64_t exit_interval : {0, 2, 6}) {
            for (double exit_minutes : {0.0, 3.0}) {
              for (int flags = 0; flags < 8; ++flags) {
                CadenceOptions o;
                o.eval_interval = eval_interval;
                o.save_interval = save_interval;
                o.save_interval_minutes = save_minutes;
                o.exit_interval = exit_interval;
                o.exit_duration_minutes = exit_minutes;
                o.save_final = (flags & 1) != 0;
                o.save_initial = (flags & 2) != 0;
                const bool has_valid = (flags & 4) != 0;
                const Cadence c(o, total, has_valid);
                for (int64_t step = 0; step < total; ++step) {
                  for (double minutes : {0.5, 1.0, 2.0}) {
                    for (double run_minutes : {1.0, 3.0}) {
                      for (bool request : {false, true}) {
                        for (int sig : {0, SIGTERM, SIGINT}) {
                          ASSERT_EQ(
                              cadence_end_of_step(c, step, minutes, run_minutes, request, sig),
                              legacy_end_of_step(o, has_valid, step, total, minutes, run_minutes,
                                                 request, sig))
                              << "total " << total << " step " << step + 1 << " eval "
                              << eval_interval << " save " << save_interval << "/" << save_minutes
                              << " exit " << exit_interval << "/" << exit_minutes << " flags "
                              << flags << " minutes " << minutes << "/" << run_minutes
                              << " request " << request << " signal " << sig;
                          ++compared;
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 100000);
}

// A whole run's schedule: 12 steps, validation every 4, a checkpoint every 5 and at the end,
// a checkpoint request during step 5 (served at step 6), SIGTERM during step 9.
TEST(Cadence, AWholeRunSchedule) {
  CadenceOptions o;
  o.eval_interval = 4;
  o.save_interval = 5;
  o.save_initial = true;
  const Cadence c(o, 12, true);
  std::vector<std::string> log;
  const Actions start = c.before_first_step(false);
  if (start.evaluate) log.push_back("eval 0");
  if (start.save != SaveReason::kNone)
    log.push_back(std::string("save 0 ") + to_string(start.save));
  bool request = false;
  for (int64_t step = 1; step <= 12; ++step) {
    if (step == 5) request = true;
    const Actions a = c.after_step(
        {.step = step, .checkpoint_requested = request, .stop_signal = step >= 9 ? SIGTERM : 0});
    if (a.consumes_checkpoint_request()) request = false;
    if (a.evaluate) log.push_back("eval " + std::to_string(step));
    if (a.save != SaveReason::kNone)
      log.push_back("save " + std::to_string(step) + " " + to_string(a.save));
    if (a.stop != StopReason::kNone) {
      log.push_back("stop " + std::to_string(step) + " " + to_string(a.stop_save));
      break;
    }
  }
  EXPECT_EQ(log, (std::vector<std::string>{"eval 0", "save 0 initial", "eval 4", "save 5 interval",
                                           "save 6 SIGUSR1", "eval 8", "stop 9 SIGTERM"}));
}

}  // namespace
}  // namespace moe::train
