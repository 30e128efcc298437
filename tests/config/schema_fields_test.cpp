// configs/schema.json against the field lists (key_specs()), both ways: every key the code
// accepts is in the schema with a compatible type, closed set, range and default, and every
// schema key is one the code accepts. A key added to one and not the other fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/key_specs.h"

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
  const json want_enum = k.choices.empty() ? json() : json(k.choices);
  if (s.value("enum", json()) != want_enum) {
    return "enum " + s.value("enum", json()).dump() + ", the code takes " + want_enum.dump();
  }
  const json& b = k.type == "array" ? s.value("items", json::object()) : s;
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

}  // namespace
}  // namespace moe::config
