#include "moe/families/hf_keys.h"

#include "moe/util/errors.h"

namespace moe::families {

using nlohmann::json;

void HfKeys::fail(const std::string& key, const std::string& what) const {
  const std::string value = c_.contains(key) ? " = " + c_[key].dump() : "";
  throw UserError("hf: " + file_ + ": " + key + value + ": " + what);
}

void HfKeys::fail_field(const std::string& key, const std::string& name,
                        const std::string& what) const {
  const json& d = c_.at(key);
  const std::string value = d.is_object() && d.contains(name) ? " = " + d.at(name).dump() : "";
  throw UserError("hf: " + file_ + ": " + key + "." + name + value + ": " + what);
}

int64_t HfKeys::integer(const std::string& key) const {
  if (!present(key)) fail(key, "missing (an integer is required)");
  if (!c_[key].is_number_integer() || c_[key].get<int64_t>() < 0) {
    fail(key, "expected a non-negative integer");
  }
  return c_[key].get<int64_t>();
}

double HfKeys::number(const std::string& key, double fallback) const {
  if (!present(key)) return fallback;
  if (!c_[key].is_number()) fail(key, "expected a number");
  return c_[key].get<double>();
}

bool HfKeys::boolean(const std::string& key, bool fallback) const {
  if (!present(key)) return fallback;
  if (!c_[key].is_boolean()) fail(key, "expected true or false");
  return c_[key].get<bool>();
}

std::string HfKeys::string(const std::string& key, const std::string& fallback) const {
  if (!present(key)) return fallback;
  if (!c_[key].is_string()) fail(key, "expected a string");
  return c_[key].get<std::string>();
}

std::vector<int64_t> HfKeys::integers(const std::string& key) const {
  if (!present(key)) return {};
  if (!c_[key].is_array()) fail(key, "expected an array of layer indices");
  std::vector<int64_t> out;
  for (const auto& v : c_[key]) {
    if (!v.is_number_integer()) fail(key, "expected an array of layer indices");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

std::vector<std::string> HfKeys::strings(const std::string& key, const std::string& what) const {
  if (!present(key)) return {};
  if (!c_[key].is_array()) fail(key, "expected an array of " + what);
  std::vector<std::string> out;
  for (const auto& v : c_[key]) {
    if (!v.is_string()) fail(key, "expected an array of " + what);
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace moe::families
