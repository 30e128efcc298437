#include "moe/cli/families_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "moe/families/model_family.h"

namespace moe::cli {

using families::all_families;
using families::ModelFamily;

std::string families_in_one_line() {
  std::string out;
  for (const ModelFamily* f : all_families()) {
    if (!out.empty()) out += ", ";
    out += std::string(f->title()) + " (" + f->architecture() + ")";
  }
  return out;
}

std::string family_model_types() { return families::listed(all_families(), true, "or"); }

CLI::App* add_families_command(CLI::App& app, FamiliesArgs& a) {
  auto* fa = app.add_subcommand(
      "families", "List the Hugging Face model families import-hf and export-hf read and write");
  fa->add_flag("--json", a.json, "As a JSON array of {model_type, architecture, title, releases}");
  fa->add_flag("--markdown", a.markdown, "As docs/hf.md's table of families");
  return fa;
}

int cmd_families(const FamiliesArgs& a) {
  if (a.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const ModelFamily* f : all_families()) {
      out.push_back({{"model_type", f->model_type()},
                     {"architecture", f->architecture()},
                     {"title", f->title()},
                     {"releases", f->releases()}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (a.markdown)
    std::printf("| family | architecture | model_type | releases |\n|---|---|---|---|\n");
  for (const ModelFamily* f : all_families()) {
    if (a.markdown) {
      std::printf("| %s | `%s` | `%s` | %s |\n", f->title(), f->architecture(), f->model_type(),
                  f->releases());
    } else {
      std::printf("%-12s %-24s %-12s %s\n", f->title(), f->architecture(), f->model_type(),
                  f->releases());
    }
  }
  return 0;
}

}  // namespace moe::cli
