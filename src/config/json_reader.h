// Strict reader for one JSON object: typed getters that remember which keys were read, so
// finish() can reject unknown keys with a did-you-mean suggestion. Errors name the JSON path.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"

namespace moe::config {

class ObjectReader {
 public:
  // `node` must outlive the reader. A null node reads as an empty object (all defaults).
  ObjectReader(const nlohmann::json* node, std::string path, std::string file);

  bool has(std::string_view key) const;
  void get(std::string_view key, bool& out);
  void get(std::string_view key, int64_t& out);
  void get(std::string_view key, uint64_t& out);
  void get(std::string_view key, double& out);
  void get(std::string_view key, std::string& out);
  void get(std::string_view key, std::array<double, 2>& out);
  void get(std::string_view key, std::vector<int64_t>& out);      // an array of integers
  void get(std::string_view key, std::vector<std::string>& out);  // an array of strings
  void get(std::string_view key, std::vector<BlendSource>& out);  // data.blend's objects
  // A nested object; absent or null gives an empty reader.
  ObjectReader child(std::string_view key);
  // Marks keys as known without reading them (accepted-and-ignored DeepSpeed keys).
  void accept(std::string_view key);
  // The value of `key` as it is, marked known; nullptr when absent or null (opaque blocks).
  const nlohmann::json* raw(std::string_view key);
  // Throws UserError for the first key that was never read or accepted.
  void finish() const;

  std::string path_of(std::string_view key) const;

 private:
  const nlohmann::json* find(std::string_view key);
  [[noreturn]] void type_error(std::string_view key, const nlohmann::json& v,
                               std::string_view expected) const;

  const nlohmann::json* node_;
  std::string path_;
  std::string file_;
  std::set<std::string, std::less<>> known_;
};

// Where a key known from other tools lives here ("learning_rate" -> "optimizer.params.lr"), or "".
std::string known_alias(std::string_view key);
// Levenshtein distance, for suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate within a small distance, or "" when nothing is close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace moe::config
