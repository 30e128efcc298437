// `moe-train completion bash`: a bash completion script generated from the CLI11 definition of
// the command line (subcommands, their options, which options take a value), so that it never
// drifts from what the parser accepts. The build writes it once more into the install tree.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace moe::cli {

// The bash script for `app` (the top-level command): a completion function and `complete -F`.
std::string bash_completion(const CLI::App& app);

}  // namespace moe::cli
