// moe-train entry point: run the CLI, turn every failure into one line and an exit code
// (0 ok, 1 internal error, 2 user error, 3 training failure).
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

#include "moe/cli/commands.h"
#include "moe/util/errors.h"

int main(int argc, char** argv) {
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
