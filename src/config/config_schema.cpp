// configs/schema.json and docs/config.md's key tables from the field lists (key_specs()) and the
// key descriptions: one walk, two renderings.
#include "moe/config/config_schema.h"

#include <cmath>
#include <string>
#include <vector>

#include "moe/config/key_specs.h"
#include "moe/util/errors.h"

namespace moe::config {

namespace {

using nlohmann::ordered_json;

// Only a refused key's disabled forms validate, as only they load.
ordered_json only_disabled() {
  return ordered_json::parse(R"([
    {"const": false},
    {"type": "object", "properties": {"enabled": {"const": false}}, "required": ["enabled"]}
  ])");
}

const KeyDescription* find_description(const std::string& path) {
  for (const KeyDescription& d : key_descriptions()) {
    if (d.path == path) return &d;
  }
  return nullptr;
}

std::string description_of(const KeySpec& k) {
  using enum KeySpec::Kind;
  switch (k.kind) {
    case kMultiGpu:
      return "multi-GPU setting; accepted and ignored with a warning";
    case kNoEffect:
      return "No effect here (" + k.no_effect + "); accepted and ignored with a warning";
    case kRefused:
      return "Not supported (" + k.refused + "); accepted only disabled";
    default:
      break;
  }
  const KeyDescription* d = find_description(k.path);
  if (d == nullptr) {
    throw std::logic_error("config key " + k.path + " has no entry in key_descriptions.cpp");
  }
  return std::string(d->text);
}

// The bounds of a range rule, as JSON Schema says them.
void add_bounds(const KeySpec& k, ordered_json& node) {
  if (k.minimum) node[k.exclusive_minimum ? "exclusiveMinimum" : "minimum"] = *k.minimum;
  if (k.maximum) node[k.exclusive_maximum ? "exclusiveMaximum" : "maximum"] = *k.maximum;
}

// A JSON number as the field list's double holds it: integral bounds print as integers.
void integral_bounds(ordered_json& node) {
  for (const char* b : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (!node.contains(b)) continue;
    const double d = node[b].get<double>();
    if (d == std::floor(d) && std::fabs(d) < 1e15) node[b] = static_cast<int64_t>(d);
  }
}

// data.blend's entries (read by json_reader.cpp, checked by validate.cpp's check_blend).
ordered_json blend_items(const std::string& path) {
  ordered_json props = ordered_json::object();
  for (const auto& [key, type] :
       std::vector<std::pair<std::string, std::string>>{{"name", "string"},
                                                        {"path", "string"},
                                                        {"weight", "number"},
                                                        {"valid_path", "string"}}) {
    ordered_json p = {{"type", type}};
    if (key == "weight") p["exclusiveMinimum"] = 0;
    const KeyDescription* d = find_description(path + "[]." + key);
    if (d == nullptr) throw std::logic_error(path + "[]." + key + " has no description");
    p["description"] = std::string(d->text);
    props[key] = p;
  }
  return {{"type", "object"},
          {"properties", props},
          {"required", {"path"}},
          {"additionalProperties", false}};
}

ordered_json field_node(const KeySpec& k) {
  ordered_json node = {{"type", k.type}, {"description", description_of(k)}};
  if (k.type == "array") {
    ordered_json items = {{"type", k.item_type}};
    if (k.item_type == "object") items = blend_items(k.path);
    if (!k.choices.empty()) items["enum"] = k.choices;
    add_bounds(k, items);
    integral_bounds(items);
    node["items"] = items;
    if (k.item_type == "number") {
      node["minItems"] = 2;
      node["maxItems"] = 2;
    }
  } else {
    if (!k.choices.empty()) node["enum"] = k.choices;
    add_bounds(k, node);
    integral_bounds(node);
    if (k.not_empty) node["minLength"] = 1;
  }
  node["default"] = k.default_value;
  return node;
}

ordered_json node_of(const KeySpec& k) {
  using enum KeySpec::Kind;
  ordered_json node;
  switch (k.kind) {
    case kField:
      node = field_node(k);
      break;
    case kObject:
      node = {{"type", "object"},
              {"description", description_of(k)},
              {"additionalProperties", false},
              {"properties", ordered_json::object()}};
      break;
    case kRefused:
      node = {{"description", description_of(k)}, {"anyOf", only_disabled()}};
      break;
    default:
      node = {{"description", description_of(k)}};
  }
  if (const KeyDescription* d = find_description(k.path); d && !d->schema_extra.empty()) {
    const ordered_json extra = ordered_json::parse(d->schema_extra);
    for (const auto& [key, value] : extra.items()) {
      if (value.is_null()) {
        node.erase(key);
      } else {
        node[key] = value;
      }
    }
  }
  return node;
}

// The "properties" object that holds `path`'s entry, found from the root each time (an
// ordered_json object is a vector: pointers into it do not survive the next insertion).
ordered_json& parent_properties(ordered_json& root, const std::string& path) {
  ordered_json* props = &root["properties"];
  for (size_t start = 0, dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    props = &(*props)[path.substr(start, dot - start)]["properties"];
  }
  return *props;
}

std::string last_part(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// "[0, 1)", ">= 1", or "" for a key with no range.
std::string range_text(const ordered_json& node) {
  auto num = [&](const char* b) { return node[b].dump(); };
  const bool lo = node.contains("minimum") || node.contains("exclusiveMinimum");
  const bool hi = node.contains("maximum") || node.contains("exclusiveMaximum");
  const char* lo_key = node.contains("minimum") ? "minimum" : "exclusiveMinimum";
  const char* hi_key = node.contains("maximum") ? "maximum" : "exclusiveMaximum";
  if (lo && hi) {
    return std::string(node.contains("minimum") ? " in [" : " in (") + num(lo_key) + ", " +
           num(hi_key) + (node.contains("maximum") ? "]" : ")");
  }
  if (lo) return std::string(node.contains("minimum") ? " >= " : " > ") + num(lo_key);
  if (hi) return std::string(node.contains("maximum") ? " <= " : " < ") + num(hi_key);
  return "";
}

std::string names_text(const ordered_json& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "`" : ", `") + n.get<std::string>() + "`";
  return s;
}

// The type column: what a value must be.
std::string type_text(const KeySpec& k, const ordered_json& node) {
  if (k.kind != KeySpec::Kind::kField) return "any";
  if (node.contains("enum")) return "one of " + names_text(node["enum"]);
  if (k.type == "array") {
    const ordered_json& items = node["items"];
    if (k.item_type == "number") return "two numbers" + range_text(items);
    if (k.item_type == "object") return "list of objects";
    if (items.contains("enum")) return "list of " + names_text(items["enum"]);
    return "list of " + k.item_type + "s" + range_text(items);
  }
  return k.type + range_text(node) + (k.not_empty ? ", not empty" : "");
}

std::string cell(std::string s) {
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.insert(i, "\\");
  return s;
}

std::string table_row(const KeySpec& k) {
  const ordered_json node = node_of(k);
  const std::string def =
      node.contains("default") ? "`" + node["default"].dump() + "`" : std::string("—");
  return "| `" + k.path + "` | " + cell(type_text(k, node)) + " | " +
         (k.kind == KeySpec::Kind::kField ? cell(def) : std::string()) + " | " +
         cell(description_of(k)) + " |\n";
}

}  // namespace

std::string config_key_tables() {
  const std::string header = "| key | type | default | meaning |\n|---|---|---|---|\n";
  std::string top = "### Top level\n\n" + header, sections;
  for (const KeySpec& k : key_specs()) {
    const bool nested = k.path.find('.') != std::string::npos;
    if (!nested && k.kind == KeySpec::Kind::kField) {
      top += table_row(k);
    } else if (!nested && k.kind == KeySpec::Kind::kObject) {
      sections += "\n### `" + k.path + "`: " + description_of(k) + "\n\n" + header;
    } else if (nested && k.kind != KeySpec::Kind::kObject) {
      sections += table_row(k);
    }
  }
  return top + sections;
}

std::string with_generated_tables(const std::string& doc, const std::string& tables,
                                  const std::string& label) {
  const auto begin = doc.find(kGeneratedBegin);
  const auto end = doc.find(kGeneratedEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    throw UserError(label + ": lacks the markers of the generated key tables ('" +
                    std::string(kGeneratedBegin) + "' ... '" + std::string(kGeneratedEnd) + "')");
  }
  const size_t from = begin + kGeneratedBegin.size();
  return doc.substr(0, from) + "\n\n" + tables + "\n" + doc.substr(end);
}

nlohmann::ordered_json config_schema() {
  ordered_json root = {
      {"$schema", "http://json-schema.org/draft-07/schema#"},
      {"$id", "https://github.com/moe-train/moe-train/configs/schema.json"},
      {"title", "moe-train configuration (a DeepSpeed ds_config.json plus moe-train sections)"},
      {"type", "object"},
      {"additionalProperties", false},
      {"properties", ordered_json::object()},
      {"required", {"data"}}};
  // key_specs() lists an object before its keys, so each parent exists when a key arrives.
  for (const KeySpec& k : key_specs()) {
    parent_properties(root, k.path)[last_part(k.path)] = node_of(k);
  }
  return root;
}

}  // namespace moe::config
