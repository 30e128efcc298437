// Every key the config accepts, as the field lists declare it, for checks that documents
// describing the config (configs/schema.json) agree with the code.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::config {

struct KeySpec {
  // How the field lists take the key: read into a member, a nested object, accepted with no
  // meaning, accepted with the multi-GPU warning, accepted with a no-effect warning, refused.
  enum class Kind { kField, kObject, kIgnored, kMultiGpu, kNoEffect, kRefused };
  Kind kind = Kind::kField;
  std::string path;  // "optimizer.params.lr"
  // The JSON Schema type: integer, number, boolean, string, array (two numbers), object, or ""
  // for keys accepted and ignored (any value).
  std::string type;
  std::string item_type;  // arrays: "number" (a pair, exactly two) or "integer" (any length)
  std::vector<std::string> choices;  // the names a closed-set string takes, in message order
  nlohmann::json default_value;      // the built-in value; null for objects and ignored keys
  // Bounds of the field's range rule (of each item for arrays); unset where there is none.
  std::optional<double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
  bool not_empty = false;  // a string that must not be empty
  // Why the key is refused (it is accepted only disabled: false or "enabled": false); "" when
  // it is accepted.
  std::string refused;
  std::string no_effect;  // kNoEffect: why the key changes nothing here
};

// Depth first, in field-list order: an object's entry precedes its keys.
std::vector<KeySpec> key_specs();

}  // namespace moe::config
