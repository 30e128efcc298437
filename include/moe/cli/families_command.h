// `moe-train families`: the Hugging Face model families import-hf and export-hf read and write,
// from the registry (moe/families/model_family.h), as text, JSON or docs/hf.md's table; and the
// one-line list the help texts show.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace moe::cli {

struct FamiliesArgs {
  bool json = false;
  bool markdown = false;
};

// "Mixtral (MixtralForCausalLM), Qwen3-MoE (Qwen3MoeForCausalLM), ..."
std::string families_in_one_line();
// "mixtral, qwen3_moe, ..." (the names --architecture takes, besides the architectures)
std::string family_model_types();

CLI::App* add_families_command(CLI::App& app, FamiliesArgs& a);
int cmd_families(const FamiliesArgs& a);

}  // namespace moe::cli
