// Shared by the config tests: the smallest valid config, reading + validating it as a file would
// be, and the UserError message a call throws.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/util/errors.h"

namespace moe::config::test_util {

inline nlohmann::json minimal() {
  return nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 4,
    "data": {"train_path": "x.h5"}
  })");
}

inline Config build(const nlohmann::json& j) {
  Config c = from_json(j, "test.json");
  validate(c);
  return c;
}

// The UserError message `fn` throws; "" when it throws none.
template <class F>
std::string user_error(F fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe::config::test_util
