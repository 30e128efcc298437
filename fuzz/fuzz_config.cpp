// libFuzzer target: config text -> JSON -> typed config -> validation. User errors are the
// expected outcome for junk; anything else (crash, sanitizer report, other exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    nlohmann::json j = moe::config::parse_json_text(text, "fuzz.json");
    if (!j.is_object()) return 0;
    moe::config::Config c = moe::config::from_json(j, "fuzz.json");
    moe::config::validate(c);
    (void)moe::config::to_json(c);
  } catch (const moe::UserError&) {
  }
  return 0;
}
