// Typed reads of a Hugging Face config.json: every error names the file and the key (and the
// field, for nested dicts such as rope_parameters.factor), as a one-line UserError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::families {

class HfKeys {
 public:
  HfKeys(const nlohmann::json& c, std::string file) : c_(c), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // A field of a nested dict (rope_parameters.factor): names the field, not the whole dict.
  [[noreturn]] void fail_field(const std::string& key, const std::string& name,
                               const std::string& what) const;
  bool has(const std::string& key) const { return c_.contains(key); }  // null included
  bool present(const std::string& key) const { return c_.contains(key) && !c_[key].is_null(); }
  int64_t integer(const std::string& key) const;  // required, non-negative
  int64_t integer(const std::string& key, int64_t fallback) const {
    return present(key) ? integer(key) : fallback;
  }
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> integers(const std::string& key) const;  // layer indices
  std::vector<std::string> strings(const std::string& key, const std::string& what) const;
  const nlohmann::json& raw(const std::string& key) const { return c_[key]; }

 private:
  const nlohmann::json& c_;
  std::string file_;
};

}  // namespace moe::families
