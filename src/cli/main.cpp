// moe-train entry point: run the CLI, turn every failure into one line and an exit code
// (0 ok, 1 internal error, 2 user error, 3 training failure).
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <unistd.h>

#include "moe/cli/commands.h"
#include "moe/parallel/launch_env.h"
#include "moe/util/errors.h"
#include "moe/util/fault_injection.h"
#include "moe/util/host_memory.h"

namespace {
// MOE_HOST_MEMORY_REPORT=1: count CPU tensor bytes from the start and report them at exit (the
// memory planner's measurement; docs/memory.md).
struct HostMemoryReport {
  bool on = std::getenv("MOE_HOST_MEMORY_REPORT") != nullptr &&
            std::string(std::getenv("MOE_HOST_MEMORY_REPORT")) == "1";
  HostMemoryReport() {
    if (on) moe::install_host_tensor_counter();
  }
  ~HostMemoryReport() {
    if (!on) return;
    std::fprintf(stderr,
                 "moe-train: host tensor memory: peak %lld bytes, live at exit %lld bytes\n",
                 static_cast<long long>(moe::host_tensor_peak_bytes()),
                 static_cast<long long>(moe::host_tensor_bytes()));
  }
};
// Launched by scripts/moe-train-launch (torchrun under systemd): the exit status of this rank
// goes into $MOE_EXIT_STATUS_DIR, so the launch can exit 2 when a rank found bad input although
// torchrun itself exits 1 for any failed rank.
int record_exit_status(int code) {
  const char* dir = std::getenv("MOE_EXIT_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return code;
  int64_t rank = 0;  // as the launcher gave it; a malformed one was reported already
  try {
    rank = moe::parallel::launch_env().rank;
  } catch (const std::exception&) {
  }
  const std::string path = std::string(dir) + "/rank-" + std::to_string(rank) + "-pid-" +
                           std::to_string(static_cast<long long>(::getpid()));
  if (std::FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%d\n", code);
    std::fclose(f);
  }
  return code;
}

int run(int argc, char** argv) {
  (void)moe::fault_injection();  // test hooks: read once, before any work
  try {
    return moe::cli::run_cli(argc, argv);
  } catch (const moe::UserError& e) {
    std::fprintf(stderr, "moe-train: error: %s\n", e.what());
    return moe::kExitUserError;
  } catch (const moe::TrainingError& e) {
    std::fprintf(stderr, "moe-train: training failed: %s\n", e.what());
    return moe::kExitTrainingFailure;
  } catch (const c10::OutOfMemoryError& e) {
    std::fprintf(stderr, "moe-train: training failed: out of memory: %s\n",
                 e.what_without_backtrace());
    return moe::kExitTrainingFailure;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "moe-train: internal error: %s\n", e.what_without_backtrace());
    return moe::kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-train: internal error: %s\n", e.what());
    return moe::kExitInternal;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int code = 0;
  {
    HostMemoryReport host_memory;
    code = run(argc, argv);
  }
  return record_exit_status(code);
}
