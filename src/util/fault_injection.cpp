#include "moe/util/fault_injection.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace moe {

namespace {

int64_t integer_or(const char* v, int64_t fallback) {
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return end != nullptr && *end == '\0' ? n : fallback;
}

std::vector<int64_t> step_list(const std::string& csv) {
  std::vector<int64_t> steps;
  std::istringstream in(csv);
  for (std::string s; std::getline(in, s, ',');) {
    const int64_t n = integer_or(s.c_str(), -1);
    if (n >= 0) steps.push_back(n);
  }
  return steps;
}

}  // namespace

bool FaultInjection::nan_at(int64_t step) const {
  return std::find(nan_steps.begin(), nan_steps.end(), step) != nan_steps.end();
}

FaultInjection FaultInjection::from(const char* (*getenv)(const char*)) {
  FaultInjection f;
  if (const char* spec = getenv("MOE_TEST_INJECT_NAN")) {
    const std::string s = spec;
    const auto steps_at = s.rfind(':');
    if (steps_at != std::string::npos) {
      f.nan_steps = step_list(s.substr(steps_at + 1));
      if (s.rfind("loss:", 0) == 0) {
        f.nan_in_loss = true;
      } else if (s.rfind("grad:", 0) == 0 && steps_at > 5) {
        f.nan_in_gradient_of = s.substr(5, steps_at - 5);
      }
    }
  }
  f.fake_oom_at_step = integer_or(getenv("MOE_TEST_FAKE_OOM_AT_STEP"), -1);
  f.pause_in_checkpoint_ms =
      static_cast<int>(integer_or(getenv("MOE_TEST_PAUSE_IN_CHECKPOINT_MS"), 0));
  f.abort_in_checkpoint_step = integer_or(getenv("MOE_TEST_ABORT_IN_CHECKPOINT"), -1);
  f.slow_update_ms = static_cast<int>(integer_or(getenv("MOE_TEST_SLOW_UPDATE_MS"), 0));
  f.die_in_all_to_all = integer_or(getenv("MOE_TEST_DIE_IN_ALL_TO_ALL"), -1);
  f.die_in_upload = integer_or(getenv("MOE_TEST_DIE_IN_UPLOAD"), -1);
  return f;
}

const FaultInjection& fault_injection() {
  static const FaultInjection f =
      FaultInjection::from([](const char* name) -> const char* { return std::getenv(name); });
  return f;
}

}  // namespace moe
