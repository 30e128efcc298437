// `moe-train config schema`: prints or writes configs/schema.json and docs/config.md's key
// tables, generated from the field lists (moe/config/config_schema.h); --check compares instead.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace moe::cli {

struct SchemaArgs {
  std::string schema_out;  // configs/schema.json; empty: the schema goes to stdout
  std::string docs;        // docs/config.md: its generated block is replaced
  bool check = false;      // compare with the files instead of writing them
};

CLI::App* add_schema_command(CLI::App& config_command, SchemaArgs& a);
int cmd_config_schema(const SchemaArgs& a);

}  // namespace moe::cli
