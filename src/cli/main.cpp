// moe-train entry point: run the CLI, turn every failure into one line and an exit code
// (0 ok, 1 internal error, 2 user error, 3 training failure).
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "moe/cli/commands.h"
#include "moe/util/errors.h"
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
}  // namespace

int main(int argc, char** argv) {
  HostMemoryReport host_memory;
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
