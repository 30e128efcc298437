// `moe-train generate`, `chat` and `bench-generate`: their options (what the two first share is
// registered once) and their dispatch; the work is in src/generate.
#pragma once

#include <optional>

#include "moe/generate/generate_command.h"

namespace CLI {
class App;
}

namespace moe::cli {

struct GenerateCommands {
  generate::GenerateOptions generate;
  generate::ChatOptions chat;
  generate::BenchGenerateOptions bench;
  CLI::App *generate_app = nullptr, *chat_app = nullptr, *bench_app = nullptr;
};

void add_generate_commands(CLI::App& app, GenerateCommands& c);
// The exit code of the one of them that was chosen; nullopt when none was.
std::optional<int> run_generate_commands(const GenerateCommands& c);

}  // namespace moe::cli
