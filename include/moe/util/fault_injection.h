// Test hooks that make faults happen on purpose, read from the environment once, at start-up
// (cli/main.cpp reads them before any work), never on the step path. Production runs leave the
// variables unset, and every field keeps its "off" value.
//   MOE_TEST_INJECT_NAN="grad:PARAM:S1,S2" | "loss:S1,S2"  a NaN in PARAM's gradient / the loss
//   MOE_TEST_FAKE_OOM_AT_STEP=N          step N throws the allocator's out-of-memory error
//   MOE_TEST_PAUSE_IN_CHECKPOINT_MS=MS   a pause between a checkpoint's files (crash windows)
//   MOE_TEST_ABORT_IN_CHECKPOINT=N       abort() half-way through step N's checkpoint
//   MOE_TEST_SLOW_UPDATE_MS=MS           each optimizer update takes MS longer (step timing)
//   MOE_TEST_DIE_IN_ALL_TO_ALL=N         the process dies (SIGKILL) at its N-th expert all-to-all
//   MOE_TEST_DIE_IN_UPLOAD=N             the process dies (SIGKILL) after uploading N checkpoint
//                                        files to checkpoint.remote (a killed upload)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

struct FaultInjection {
  bool nan_in_loss = false;        // "loss:..."
  std::string nan_in_gradient_of;  // "grad:PARAM:..."
  std::vector<int64_t> nan_steps;  // 1-based steps
  int64_t fake_oom_at_step = -1;
  int pause_in_checkpoint_ms = 0;
  int64_t abort_in_checkpoint_step = -1;
  int slow_update_ms = 0;
  int64_t die_in_all_to_all = -1;
  int64_t die_in_upload = -1;

  bool nan_at(int64_t step) const;
  // Parsed from a getenv-like lookup (tests pass their own).
  static FaultInjection from(const char* (*getenv)(const char*));
};

// The process's hooks, read from the environment on the first call.
const FaultInjection& fault_injection();

}  // namespace moe
