// The moe-train command line: subcommands and their options (CLI11). main() only calls
// run_cli() and turns exceptions into one line and an exit code.
#pragma once

namespace moe::cli {

// Parses argv and runs the chosen command. Returns the exit code for success or CLI errors;
// user and training errors propagate as exceptions (moe/util/errors.h).
int run_cli(int argc, char** argv);

}  // namespace moe::cli
