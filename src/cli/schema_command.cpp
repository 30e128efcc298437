// `moe-train config schema`: the config's documents from the code (moe/config/config_schema.h).
#include "moe/cli/schema_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "moe/config/config_schema.h"
#include "moe/util/errors.h"

namespace moe::cli {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("config schema: cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Written beside the file, then renamed over it: a failed write leaves the old file whole.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError("config schema: cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw UserError("config schema: cannot replace " + path + ": " + ec.message());
}

// Writes `text` to `path`, or (check) says whether the file already holds it.
bool update(const std::string& path, const std::string& text, bool check) {
  if (!check) {
    write_text(path, text);
    std::fprintf(stderr, "wrote %s\n", path.c_str());
    return true;
  }
  if (read_text(path) == text) return true;
  std::fprintf(stderr,
               "%s is not what the code generates (src/config/fields.h, key_descriptions.cpp); "
               "run: moe-train config schema --out configs/schema.json --docs docs/config.md\n",
               path.c_str());
  return false;
}

}  // namespace

CLI::App* add_schema_command(CLI::App& config_command, SchemaArgs& a) {
  auto* c = config_command.add_subcommand(
      "schema",
      "Print configs/schema.json (JSON Schema of every key), or write it and the key "
      "tables of docs/config.md");
  c->add_option("--out", a.schema_out, "Write the schema to this file instead of stdout");
  c->add_option("--docs", a.docs, "Replace the generated key tables in this markdown file");
  c->add_flag("--check", a.check,
              "Compare --out / --docs with what would be written; exit 1 when they differ");
  return c;
}

int cmd_config_schema(const SchemaArgs& a) {
  if (a.check && a.schema_out.empty() && a.docs.empty()) {
    throw UserError("config schema: --check needs --out FILE and/or --docs FILE to compare");
  }
  const std::string schema = config::config_schema().dump(2) + "\n";
  bool current = true;
  if (a.schema_out.empty() && a.docs.empty()) std::cout << schema;
  if (!a.schema_out.empty()) current = update(a.schema_out, schema, a.check) && current;
  if (!a.docs.empty()) {
    const std::string doc = config::with_generated_tables(
        read_text(a.docs), config::config_key_tables(), "config schema: " + a.docs);
    current = update(a.docs, doc, a.check) && current;
  }
  return current ? kExitOk : 1;
}

}  // namespace moe::cli
