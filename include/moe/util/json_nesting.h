// How deeply JSON text nests its arrays and objects, before nlohmann parses it: nlohmann parses
// any depth, but copying, comparing or printing the result recurses once per level, so a
// downloaded file of a million '[' would overflow the stack there. Python's json module stops
// near 1,000 levels and serde_json (Hugging Face's tokenizers) at 128; real files nest under 20.
#pragma once

#include <cstddef>
#include <string_view>

#include "moe/util/input_limits.h"

namespace moe {

// 512 unless `moe-train --limit json.nesting=N` changed it.
inline int64_t max_json_nesting() { return input_limits().json_nesting; }

// True when `text` (JSON, valid or not) nests arrays and objects more than `limit` deep
// (max_json_nesting() when negative); the brackets inside strings do not count.
inline bool json_nests_deeper_than(std::string_view text, int64_t limit = -1) {
  if (limit < 0) limit = max_json_nesting();
  int64_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

}  // namespace moe
