// configs/schema.json against the field lists (key_specs()), both ways: every key the code
// accepts is in the schema with a compatible type, closed set, range and default, and every
// schema key is one the code accepts. A key added to one and not the other fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config_schema.h"
#include "moe/config/key_specs.h"
#include "moe/util/errors.h"

namespace moe::config {
namespace {

using nlohmann::json;

// Every property of the schema, at every depth, by dotted path.
void flatten(const json& node, const std::string& prefix, std::map<std::string, json>& out) {
  if (!node.contains("properties")) return;
  for (const auto& [key, value] : node["properties"].items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    out[path] = value;
    flatten(value, path, out);
  }
}

std::map<std::string, json> schema_keys() {
  std::ifstream in(MOE_SOURCE_DIR "/configs/schema.json");
  std::map<std::string, json> out;
  flatten(json::parse(in), "", out);
  return out;
}

std::string bound_mismatch(const json& s, const char* key, double want) {
  if (!s.contains(key)) return std::string("lacks ") + key + " " + json(want).dump();
  if (s[key].get<double>() != want) {
    return std::string(key) + " " + s[key].dump() + ", the code's bound is " + json(want).dump();
  }
  return "";
}

// The schema of a refused key: only its disabled forms validate, as only they load.
const json kOnlyDisabled = json::parse(R"([
  {"const": false},
  {"type": "object", "properties": {"enabled": {"const": false}}, "required": ["enabled"]}
])");

// What the schema entry `s` gets wrong about key `k`; "" when nothing.
std::string mismatch(const KeySpec& k, const json& s) {
  if (!k.refused.empty()) {
    return s.value("anyOf", json()) == kOnlyDisabled
               ? ""
               : "needs anyOf " + kOnlyDisabled.dump() + " (refused unless disabled)";
  }
  if (k.type.empty()) return "";  // accepted and ignored: any value, so any schema
  const std::string type = s.value("type", "<none>");
  if (type != k.type) return "type " + type + ", the code reads " + k.type;
  if (k.type == "object" && s.value("additionalProperties", true)) {
    return "needs additionalProperties: false (unknown keys are errors)";
  }
  // A list's closed set is its items' enum.
  const json& b = k.type == "array" ? s.value("items", json::object()) : s;
  const json want_enum = k.choices.empty() ? json() : json(k.choices);
  if (b.value("enum", json()) != want_enum) {
    return "enum " + b.value("enum", json()).dump() + ", the code takes " + want_enum.dump();
  }
  if (k.type == "array" && b.value("type", "") != k.item_type) {
    return "needs " + k.item_type + " items";
  }
  if (k.type == "array" && k.item_type == "number" &&
      (s.value("minItems", 0) != 2 || s.value("maxItems", 0) != 2)) {
    return "needs exactly two number items";
  }
  std::string why;
  if (k.minimum) {
    why = bound_mismatch(b, k.exclusive_minimum ? "exclusiveMinimum" : "minimum", *k.minimum);
  }
  if (why.empty() && k.maximum) {
    why = bound_mismatch(b, k.exclusive_maximum ? "exclusiveMaximum" : "maximum", *k.maximum);
  }
  if (why.empty() && k.not_empty && s.value("minLength", 0) != 1) {
    why = "needs minLength: 1 (an empty value is an error)";
  }
  if (why.empty() && s.contains("default") && s["default"] != k.default_value) {
    why = "default " + s["default"].dump() + ", the code's " + k.default_value.dump();
  }
  return why;
}

TEST(ConfigSchema, EveryFieldIsInTheSchemaWithItsTypeRangeAndDefault) {
  const auto schema = schema_keys();
  const auto specs = key_specs();
  ASSERT_GT(specs.size(), 100u);
  for (const KeySpec& k : specs) {
    auto it = schema.find(k.path);
    if (it == schema.end()) {
      ADD_FAILURE() << k.path << ": in the field lists, missing from configs/schema.json";
      continue;
    }
    const std::string why = mismatch(k, it->second);
    EXPECT_EQ(why, "") << k.path << ": configs/schema.json says " << it->second.dump();
  }
}

TEST(ConfigSchema, EverySchemaKeyIsInTheFieldLists) {
  std::set<std::string> known;
  for (const KeySpec& k : key_specs()) known.insert(k.path);
  for (const auto& [path, node] : schema_keys()) {
    EXPECT_TRUE(known.count(path)) << path << ": in configs/schema.json, not in the field lists "
                                   << "(src/config/fields.h)";
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The committed documents are what `moe-train config schema` generates from the code.
TEST(ConfigSchema, CommittedSchemaIsGenerated) {
  EXPECT_EQ(read_file(MOE_SOURCE_DIR "/configs/schema.json"), config_schema().dump(2) + "\n")
      << "run: moe-train config schema --out configs/schema.json --docs docs/config.md";
}

TEST(ConfigSchema, CommittedDocTablesAreGenerated) {
  const std::string doc = read_file(MOE_SOURCE_DIR "/docs/config.md");
  EXPECT_EQ(doc, with_generated_tables(doc, config_key_tables(), "docs/config.md"))
      << "run: moe-train config schema --out configs/schema.json --docs docs/config.md";
}

// Every key the field lists read has its own description, and every description names a key.
TEST(ConfigSchema, EveryKeyIsDescribedOnce) {
  std::set<std::string> described, keys;
  for (const KeyDescription& d : key_descriptions()) {
    EXPECT_TRUE(described.insert(std::string(d.path)).second) << d.path << " described twice";
    EXPECT_FALSE(d.text.empty()) << d.path << ": empty description";
  }
  for (const KeySpec& k : key_specs()) {
    keys.insert(k.path);
    const bool own = k.kind == KeySpec::Kind::kField || k.kind == KeySpec::Kind::kObject;
    if (own) {
      EXPECT_TRUE(described.count(k.path)) << k.path << ": no description";
    }
  }
  for (const std::string& d : described) {
    const std::string key = d.substr(0, d.find("[]."));  // a list entry's key: its list
    EXPECT_TRUE(keys.count(key)) << d << ": described, but not a key of the field lists";
  }
}

// A document without the markers is an error naming it, not a silent append.
TEST(ConfigSchema, DocWithoutMarkersIsRefused) {
  EXPECT_THROW(with_generated_tables("# no markers\n", "| t |\n", "x.md"), UserError);
}

}  // namespace
}  // namespace moe::config
