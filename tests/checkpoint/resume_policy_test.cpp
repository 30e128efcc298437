// Where a run starts, on real directories: state.json reading, the choice of checkpoint
// (explicit, newest loadable, the one before a damaged one, a finished run, none), setting an
// earlier run aside and cutting metrics.jsonl back to a checkpoint.
#include "moe/checkpoint/resume_policy.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Action = ResumeDecision::Action;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A state.json as save_checkpoint writes it.
json state_json(int64_t step) {
  json j;
  j["format_version"] = kStateFormatVersion;
  j["step"] = step;
  j["tokens"] = step * 64;
  j["loader"] = {{"epoch", 1}, {"position", 7}};
  j["loss_scaler"] = {{"scale", 65536.0},
                      {"cur_iter", step},
                      {"last_overflow_iter", -1},
                      {"cur_hysteresis", 2},
                      {"skipped_steps", 0}};
  j["rng"]["cpu"] = "00ff";
  j["metrics_lines"] = step + 1;
  j["config"] = {{"train_batch_size", 4}};
  return j;
}

class ResumePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_resume_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    ::moe::remove_tree(dir_);
    fs::create_directories(dir_);
    log_ = std::make_shared<spdlog::logger>(
        "resume-test", std::make_shared<spdlog::sinks::ostream_sink_st>(log_text_));
    log_->set_pattern("%l %v");
  }
  void TearDown() override { ::moe::remove_tree(dir_); }

  fs::path checkpoints() const { return dir_ / "checkpoints"; }
  // A checkpoint directory step-NNNNNNNN with the given state.json text.
  std::string checkpoint(int64_t step, const std::string& state) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
    const fs::path d = checkpoints() / name;
    fs::create_directories(d);
    std::ofstream(d / "state.json") << state;
    return d.string();
  }
  std::string checkpoint(int64_t step) { return checkpoint(step, state_json(step).dump(2)); }
  void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

  fs::path dir_;
  std::ostringstream log_text_;
  std::shared_ptr<spdlog::logger> log_;
};

ResumeRequest auto_resume() { return ResumeRequest{}; }

// ---- state.json ----

TEST_F(ResumePolicyTest, ReadsEveryFieldAndKeepsTheDocument) {
  const std::string d = checkpoint(20);
  const CheckpointState s = read_checkpoint_state(d);
  EXPECT_EQ(s.path, (fs::path(d) / "state.json").string());
  EXPECT_EQ(s.step, 20);
  EXPECT_EQ(s.tokens, 1280);
  EXPECT_EQ(s.loader.epoch, 1);
  EXPECT_EQ(s.loader.position, 7);
  EXPECT_EQ(s.scaler.scale, 65536.0);
  EXPECT_EQ(s.scaler.cur_iter, 20);
  EXPECT_EQ(s.scaler.last_overflow_iter, -1);
  EXPECT_EQ(s.scaler.cur_hysteresis, 2);
  EXPECT_EQ(s.scaler.skipped_steps, 0);
  EXPECT_EQ(s.metrics_lines, 21);
  EXPECT_EQ(s.config, (json{{"train_batch_size", 4}}));
  EXPECT_EQ(s.document.at("rng").at("cpu"), "00ff");  // for the LibTorch side
}

// The message of the UserError read_checkpoint_state throws for `dir`.
std::string state_error(const std::string& dir) {
  try {
    read_checkpoint_state(dir);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(ResumePolicyTest, DamagedStateFilesAreUserErrorsNamingTheFile) {
  const std::string path = (checkpoints() / "step-00000001" / "state.json").string();
  const std::string missing = checkpoint(1);
  fs::remove(fs::path(missing) / "state.json");
  EXPECT_EQ(state_error(missing), "checkpoint: " + path + ": missing");
  EXPECT_EQ(read_state_file(missing).status, StateFile::Status::kMissing);

  const std::string invalid = checkpoint(2, "{");
  const std::string e = state_error(invalid);
  EXPECT_EQ(e.rfind("checkpoint: " + (fs::path(invalid) / "state.json").string() +
                        ": invalid JSON: [json.exception.parse_error.101]",
                    0),
            0u)
      << e;
  EXPECT_EQ(read_state_file(invalid).status, StateFile::Status::kInvalidJson);

  json v = state_json(3);
  v["format_version"] = 99;
  const std::string version = checkpoint(3, v.dump());
  EXPECT_EQ(state_error(version), "checkpoint: " + (fs::path(version) / "state.json").string() +
                                      ": format_version 99; expected 1");

  json f = state_json(4);
  f.erase("loader");
  const std::string field = checkpoint(4, f.dump());
  EXPECT_EQ(state_error(field), "checkpoint: " + (fs::path(field) / "state.json").string() +
                                    ": [json.exception.out_of_range.403] key 'loader' not found");

  json t = state_json(5);
  t["step"] = "five";
  const std::string type = checkpoint(5, t.dump());
  EXPECT_NE(state_error(type).find(": [json.exception.type_error.302] type must be number"),
            std::string::npos)
      << state_error(type);

  // The version is checked before the other fields.
  json both = state_json(6);
  both["format_version"] = 2;
  both.erase("step");
  EXPECT_NE(state_error(checkpoint(6, both.dump())).find("format_version 2; expected 1"),
            std::string::npos);
  // Not an object at all.
  EXPECT_NE(state_error(checkpoint(7, "[1, 2]")).find("[json.exception.type_error.304]"),
            std::string::npos);
}

TEST_F(ResumePolicyTest, PeekReadsOnlyTheStep) {
  EXPECT_EQ(peek_checkpoint_step(checkpoint(40)), 40);
  // Only the step matters: another format or missing fields still peek.
  EXPECT_EQ(peek_checkpoint_step(checkpoint(41, R"({"step": 41, "format_version": 99})")), 41);
  EXPECT_EQ(peek_checkpoint_step(checkpoint(42, "{")), -1);
  EXPECT_EQ(peek_checkpoint_step(checkpoint(43, R"({"step": 43.5})")), -1);
  EXPECT_EQ(peek_checkpoint_step(checkpoint(44, R"({"step": "44"})")), -1);
  EXPECT_EQ(peek_checkpoint_step(checkpoint(45, "[45]")), -1);
  EXPECT_EQ(peek_checkpoint_step(checkpoint(46, R"({"tokens": 1})")), -1);
  EXPECT_EQ(peek_checkpoint_step((dir_ / "no_such_checkpoint").string()), -1);
}

// ---- the choice of checkpoint ----

TEST_F(ResumePolicyTest, NoCheckpointsStartsFresh) {
  const ResumeDecision d = decide_resume(auto_resume(), {}, 10, checkpoints().string());
  EXPECT_EQ(d.action, Action::kFresh);
  EXPECT_TRUE(d.starts_fresh());
}

TEST_F(ResumePolicyTest, NewestLoadableIsTried) {
  const std::vector<std::string> c = {checkpoint(30), checkpoint(20)};
  const ResumeDecision d = decide_resume(auto_resume(), c, 40, checkpoints().string());
  EXPECT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, c[0]);
  EXPECT_TRUE(d.fallback);
  EXPECT_EQ(d.next_index, 1u);
  EXPECT_FALSE(d.starts_fresh());
}

TEST_F(ResumePolicyTest, ExplicitDirectoryIsLoadedAsGiven) {
  const std::vector<std::string> c = {checkpoint(30), checkpoint(20)};
  ResumeRequest o;
  o.resume_from = c[1];
  o.overwrite = true;  // ignored with --resume
  o.resume = false;    // --resume wins over --no-resume too
  ResumeDecision d = decide_resume(o, c, 40, checkpoints().string());
  EXPECT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, c[1]);
  EXPECT_FALSE(d.fallback);  // its errors are the user's
  // Even a finished checkpoint: no finished-run check for an explicit one.
  o.resume_from = checkpoint(40);
  d = decide_resume(o, c, 40, checkpoints().string());
  EXPECT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, o.resume_from);
}

TEST_F(ResumePolicyTest, NoResumeAndOverwriteStartFresh) {
  const std::vector<std::string> c = {checkpoint(30)};
  ResumeRequest no_resume;
  no_resume.resume = false;
  EXPECT_EQ(decide_resume(no_resume, c, 40, checkpoints().string()).action, Action::kFresh);
  ResumeRequest overwrite;
  overwrite.overwrite = true;
  EXPECT_EQ(decide_resume(overwrite, c, 40, checkpoints().string()).action, Action::kFresh);
  // A finished run is not even looked at: --overwrite deletes it.
  const std::vector<std::string> finished = {checkpoint(40)};
  EXPECT_EQ(decide_resume(overwrite, finished, 40, checkpoints().string()).action, Action::kFresh);
}

TEST_F(ResumePolicyTest, DamagedNewestFallsBackToTheOneBefore) {
  const std::vector<std::string> c = {checkpoint(30, "{"), checkpoint(20), checkpoint(10)};
  // An unreadable state.json is still tried: the load is what reports the problem.
  ResumeDecision d = decide_resume(auto_resume(), c, 40, checkpoints().string());
  ASSERT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, c[0]);
  // The caller's load fails; it asks again from the next one.
  d = decide_resume(auto_resume(), c, 40, checkpoints().string(), d.next_index);
  ASSERT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, c[1]);
  EXPECT_EQ(d.next_index, 2u);
  EXPECT_EQ(unusable_checkpoint_message(c[0], "checkpoint: x: missing"),
            "checkpoint " + c[0] + " is unusable (checkpoint: x: missing); trying the one before");
}

TEST_F(ResumePolicyTest, NoLoadableCheckpointIsAnError) {
  const std::vector<std::string> c = {checkpoint(30, "{"), checkpoint(20, "{")};
  ResumeDecision d = decide_resume(auto_resume(), c, 40, checkpoints().string(), 2);
  EXPECT_EQ(d.action, Action::kNoneLoadable);
  EXPECT_EQ(d.message, "checkpoint: no loadable checkpoint in " + checkpoints().string() +
                           " (see the errors above); use --no-resume to start over");
  EXPECT_FALSE(d.starts_fresh());
}

TEST_F(ResumePolicyTest, FinishedRunStartsANewOne) {
  const std::vector<std::string> c = {checkpoint(40), checkpoint(30)};
  ResumeDecision d = decide_resume(auto_resume(), c, 40, checkpoints().string());
  EXPECT_EQ(d.action, Action::kFinished);
  EXPECT_TRUE(d.starts_fresh());
  EXPECT_EQ(d.dir, c[0]);
  EXPECT_EQ(d.step, 40);
  EXPECT_EQ(d.message, c[0] + " holds a finished run (step 40 of 40); starting a new run");
  // Beyond the end counts as finished too (a run now configured shorter).
  d = decide_resume(auto_resume(), c, 35, checkpoints().string());
  EXPECT_EQ(d.action, Action::kFinished);
  EXPECT_EQ(d.message, c[0] + " holds a finished run (step 40 of 35); starting a new run");
  // A finished run behind an unusable newest one: still finished.
  d = decide_resume(auto_resume(), {checkpoint(41, "{"), c[0]}, 40, checkpoints().string(), 1);
  EXPECT_EQ(d.action, Action::kFinished);
  EXPECT_EQ(d.dir, c[0]);
}

// The caller's loop, with read_checkpoint_state standing in for the LibTorch load.
TEST_F(ResumePolicyTest, CallerLoopSkipsUnusableCheckpointsAndReportsThem) {
  json no_loader = state_json(30);
  no_loader.erase("loader");
  const std::vector<std::string> c = {checkpoint(40, "{"), checkpoint(30, no_loader.dump()),
                                      checkpoint(20), checkpoint(10)};
  std::vector<std::string> errors;
  int64_t resumed_from = -1;
  ResumeDecision d = decide_resume(auto_resume(), c, 50, checkpoints().string());
  while (d.action == Action::kLoad) {
    try {
      resumed_from = read_checkpoint_state(d.dir).step;
      break;
    } catch (const UserError& e) {
      ASSERT_TRUE(d.fallback);
      errors.push_back(unusable_checkpoint_message(d.dir, e.what()));
      d = decide_resume(auto_resume(), c, 50, checkpoints().string(), d.next_index);
    }
  }
  EXPECT_EQ(d.action, Action::kLoad);
  EXPECT_EQ(d.dir, c[2]);
  EXPECT_EQ(resumed_from, 20);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("step-00000040 is unusable (checkpoint: "), std::string::npos);
  EXPECT_NE(errors[0].find("invalid JSON"), std::string::npos);
  EXPECT_NE(errors[1].find("key 'loader' not found); trying the one before"), std::string::npos);
}

// ---- setting an earlier run aside ----

TEST_F(ResumePolicyTest, TimeStampIsLocalTime) {
  const char* tz = std::getenv("TZ");
  const std::string saved = tz ? tz : "";
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(run_time_stamp(1704164645), "20240102-030405");  // 2024-01-02 03:04:05 UTC
  setenv("TZ", "IST-5:30", 1);                               // POSIX form: 5 h 30 min east of UTC
  tzset();
  EXPECT_EQ(run_time_stamp(1704164645), "20240102-083405");
  if (tz) {
    setenv("TZ", saved.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

TEST_F(ResumePolicyTest, EarlierRunIsKeptWithTheStamp) {
  write(dir_ / "metrics.jsonl", "{\"old\": true}\n");
  write(dir_ / "config.json", "{}\n");
  checkpoint(10);
  write(dir_ / "other.txt", "mine\n");  // not a file a run writes: left alone
  const auto kept = set_aside_previous_run(dir_.string(), false, "20240102-030405", *log_);
  EXPECT_EQ(kept, (std::vector<std::string>{(dir_ / "metrics.jsonl.prev-20240102-030405").string(),
                                            (dir_ / "config.json.prev-20240102-030405").string(),
                                            (dir_ / "checkpoints.prev-20240102-030405").string()}));
  EXPECT_FALSE(fs::exists(dir_ / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ / "config.json"));
  EXPECT_FALSE(fs::exists(checkpoints()));
  EXPECT_EQ(slurp(dir_ / "metrics.jsonl.prev-20240102-030405"), "{\"old\": true}\n");
  EXPECT_TRUE(
      fs::exists(dir_ / "checkpoints.prev-20240102-030405" / "step-00000010" / "state.json"));
  EXPECT_EQ(slurp(dir_ / "other.txt"), "mine\n");
  const std::string d = dir_.string();
  EXPECT_EQ(log_text_.str(), "warning " + d +
                                 " held an earlier run; kept its metrics.jsonl as "
                                 "metrics.jsonl.prev-20240102-030405\n"
                                 "warning " +
                                 d +
                                 " held an earlier run; kept its config.json as "
                                 "config.json.prev-20240102-030405\n"
                                 "warning " +
                                 d +
                                 " held an earlier run; kept its checkpoints as "
                                 "checkpoints.prev-20240102-030405\n");
}

TEST_F(ResumePolicyTest, OnlyExistingFilesAreSetAside) {
  write(dir_ / "metrics.jsonl", "x\n");
  const auto kept = set_aside_previous_run(dir_.string(), false, "S", *log_);
  EXPECT_EQ(kept, (std::vector<std::string>{(dir_ / "metrics.jsonl.prev-S").string()}));
  // An empty (or missing) directory: nothing to do, nothing logged.
  log_text_.str("");
  EXPECT_TRUE(set_aside_previous_run((dir_ / "empty").string(), false, "S", *log_).empty());
  EXPECT_EQ(log_text_.str(), "");
}

TEST_F(ResumePolicyTest, OverwriteDeletesTheEarlierRun) {
  write(dir_ / "metrics.jsonl", "x\n");
  write(dir_ / "config.json", "{}\n");
  checkpoint(10);
  EXPECT_TRUE(set_aside_previous_run(dir_.string(), true, "S", *log_).empty());
  EXPECT_FALSE(fs::exists(dir_ / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ / "config.json"));
  EXPECT_FALSE(fs::exists(checkpoints()));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
  EXPECT_EQ(log_text_.str(), "");  // deleting is silent
}

TEST_F(ResumePolicyTest, AFailedRenameIsAUserError) {
  // A set-aside checkpoints directory of the same second already holds files.
  checkpoint(10);
  fs::create_directories(dir_ / "checkpoints.prev-S" / "step-00000005");
  try {
    set_aside_previous_run(dir_.string(), false, "S", *log_);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("cannot keep " + checkpoints().string() + " as " +
                            (dir_ / "checkpoints.prev-S").string() + ": ",
                        0),
              0u)
        << msg;
  }
  EXPECT_TRUE(fs::exists(checkpoints() / "step-00000010"));
}

// ---- metrics.jsonl back to what a checkpoint covers ----

TEST_F(ResumePolicyTest, MetricsAreCutToTheCheckpointsLines) {
  const fs::path m = dir_ / "metrics.jsonl";
  write(m, "a\nb\nc\nd\n");
  truncate_metrics(m, 2);
  EXPECT_EQ(slurp(m), "a\nb\n");
  truncate_metrics(m, 5);  // fewer lines than covered: all kept
  EXPECT_EQ(slurp(m), "a\nb\n");
  truncate_metrics(m, 0);
  EXPECT_EQ(slurp(m), "");
  // A torn last line (a crash mid-write) that the count covers gets its newline.
  write(m, "a\nb");
  truncate_metrics(m, 2);
  EXPECT_EQ(slurp(m), "a\nb\n");
  // No metrics file: an empty one.
  truncate_metrics(dir_ / "none.jsonl", 3);
  EXPECT_TRUE(fs::exists(dir_ / "none.jsonl"));
  EXPECT_EQ(slurp(dir_ / "none.jsonl"), "");
}

}  // namespace
}  // namespace moe::checkpoint
