#include "moe/checkpoint/resume_policy.h"

#include <spdlog/spdlog.h>

#include <fstream>

#include "moe/util/errors.h"
#include "moe/util/remove_tree.h"

namespace moe::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The files a fresh run writes; an earlier run's copies are kept (renamed) unless --overwrite.
constexpr const char* kRunFiles[] = {"metrics.jsonl", "config.json", "checkpoints"};

}  // namespace

StateFile read_state_file(const std::string& dir) {
  StateFile f;
  f.path = (fs::path(dir) / "state.json").string();
  std::ifstream in(f.path);
  if (!in) return f;  // kMissing
  try {
    f.json = json::parse(in);
    f.status = StateFile::Status::kOk;
  } catch (const json::exception& e) {
    f.status = StateFile::Status::kInvalidJson;
    f.error = e.what();
  }
  return f;
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  StateFile f = read_state_file(dir);
  if (f.status == StateFile::Status::kMissing) {
    throw UserError("checkpoint: " + f.path + ": missing");
  }
  if (f.status == StateFile::Status::kInvalidJson) {
    throw UserError("checkpoint: " + f.path + ": invalid JSON: " + f.error);
  }
  const json& j = f.json;
  CheckpointState s;
  s.path = f.path;
  try {
    // The version first: another format's fields may mean something else.
    if (j.at("format_version").get<int64_t>() != kStateFormatVersion) {
      throw UserError("checkpoint: " + f.path + ": format_version " +
                      j.at("format_version").dump() + "; expected " +
                      std::to_string(kStateFormatVersion));
    }
    s.step = j.at("step").get<int64_t>();
    s.tokens = j.at("tokens").get<int64_t>();
    s.loader = {j.at("loader").at("epoch").get<int64_t>(),
                j.at("loader").at("position").get<int64_t>()};
    const auto& ls = j.at("loss_scaler");
    s.scaler = {ls.at("scale").get<double>(), ls.at("cur_iter").get<int64_t>(),
                ls.at("last_overflow_iter").get<int64_t>(), ls.at("cur_hysteresis").get<int64_t>(),
                ls.at("skipped_steps").get<int64_t>()};
    s.metrics_lines = j.at("metrics_lines").get<int64_t>();
    s.config = j.at("config");
  } catch (const json::exception& e) {
    throw UserError("checkpoint: " + f.path + ": " + e.what());
  }
  s.document = std::move(f.json);
  return s;
}

int64_t peek_checkpoint_step(const std::string& dir) {
  const StateFile f = read_state_file(dir);
  if (f.status != StateFile::Status::kOk) return -1;
  const json& j = f.json;
  return j.is_object() && j.contains("step") && j["step"].is_number_integer()
             ? j["step"].get<int64_t>()
             : -1;
}

ResumeDecision decide_resume(const ResumeRequest& opt, const std::vector<std::string>& candidates,
                             int64_t total_steps, const std::string& checkpoints_root,
                             size_t first) {
  ResumeDecision d;
  if (!opt.resume_from.empty()) {
    // The user named it: its errors are reported as they are, and even a finished run loads.
    d.action = ResumeDecision::Action::kLoad;
    d.dir = opt.resume_from;
    return d;
  }
  // --no-resume starts over; --overwrite deletes the earlier run instead of continuing it.
  if (!opt.resume || opt.overwrite) return d;
  for (size_t i = first; i < candidates.size(); ++i) {
    const std::string& dir = candidates[i];
    const int64_t step = peek_checkpoint_step(dir);
    if (step >= total_steps) {
      // A finished run is not continued: a new one starts and the old one is kept aside.
      d.action = ResumeDecision::Action::kFinished;
      d.dir = dir;
      d.step = step;
      d.message = dir + " holds a finished run (step " + std::to_string(step) + " of " +
                  std::to_string(total_steps) + "); starting a new run";
      return d;
    }
    // An unreadable state.json (step -1) is tried too: the load reports what is wrong with it.
    d.action = ResumeDecision::Action::kLoad;
    d.dir = dir;
    d.fallback = true;
    d.next_index = i + 1;
    return d;
  }
  // Checkpoints exist but none loaded: starting over would hide them, so the user decides.
  if (!candidates.empty()) {
    d.action = ResumeDecision::Action::kNoneLoadable;
    d.message = "checkpoint: no loadable checkpoint in " + checkpoints_root +
                " (see the errors above); use --no-resume to start over";
  }
  return d;
}

std::string unusable_checkpoint_message(const std::string& dir, const std::string& what) {
  return "checkpoint " + dir + " is unusable (" + what + "); trying the one before";
}

std::string run_time_stamp(std::time_t when) {
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&when));
  return stamp;
}

std::vector<std::string> set_aside_previous_run(const std::string& dir, bool overwrite,
                                                const std::string& stamp, spdlog::logger& log) {
  std::vector<std::string> kept_as;
  std::error_code ec;
  for (const char* name : kRunFiles) {
    fs::path p = fs::path(dir) / name;
    if (!fs::exists(p, ec)) continue;
    if (overwrite) {
      remove_tree(p, ec);  // best effort, as the files are about to be rewritten
      continue;
    }
    fs::path kept = p;
    kept += std::string(".prev-") + stamp;
    fs::rename(p, kept, ec);
    if (ec)
      throw UserError("cannot keep " + p.string() + " as " + kept.string() + ": " + ec.message());
    log.warn("{} held an earlier run; kept its {} as {}", dir, name, kept.filename().string());
    kept_as.push_back(kept.string());
  }
  return kept_as;
}

void truncate_metrics(const fs::path& path, int64_t lines) {
  std::ifstream in(path);
  std::string kept, line;
  for (int64_t i = 0; i < lines && std::getline(in, line); ++i) kept += line + "\n";
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
}

}  // namespace moe::checkpoint
