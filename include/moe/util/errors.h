// Error types that map to the CLI's exit codes. Library code throws; only main() exits.
#pragma once

#include <stdexcept>
#include <string>

namespace moe {

// Bad input from the user: CLI arguments, config, data files, paths. Exit code 2.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run itself failed: divergence, out of memory, disk full while checkpointing. Exit code 3.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,
  kExitUserError = 2,
  kExitTrainingFailure = 3,
};

}  // namespace moe
