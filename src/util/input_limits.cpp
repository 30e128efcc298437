#include "moe/util/input_limits.h"

#include <charconv>

#include "moe/util/errors.h"

namespace moe {

namespace {

InputLimits& mutable_limits() {
  static InputLimits limits;
  return limits;
}

struct Entry {
  const char* name;
  int64_t InputLimits::*field;
  int64_t max;
  const char* what;
};

// The upper bounds: the recursion limits stop where an 8 MiB thread stack would (a render level
// takes under 1 KiB, a parser level a few hundred bytes); the rest where the counts stay exact
// and the byte sizes within 64 GiB (PCRE2 counts its heap in KiB in 32 bits).
constexpr int64_t kMaxCount = int64_t{1} << 40;
const Entry kEntries[] = {
    {"template.nesting", &InputLimits::template_nesting, 1000,
     "chat template: expressions, blocks, macro calls and built lists nested in each other"},
    {"template.range_items", &InputLimits::template_range_items, kMaxCount,
     "chat template: items of one range() (Jinja2's sandbox: 100,000)"},
    {"template.loop_iterations", &InputLimits::template_loop_iterations, kMaxCount,
     "chat template: for-loop iterations in one rendering"},
    {"template.macro_calls", &InputLimits::template_macro_calls, kMaxCount,
     "chat template: macro calls in one rendering"},
    {"template.text_mib", &InputLimits::template_text_mib, 65536,
     "chat template: MiB of the output and of any one string built"},
    {"template.built_items", &InputLimits::template_built_items, kMaxCount,
     "chat template: items of the lists and dicts built in one rendering"},
    {"template.built_mib", &InputLimits::template_built_mib, 65536,
     "chat template: MiB of the strings in the lists and dicts built in one rendering"},
    {"template.render_depth", &InputLimits::template_render_depth, 6000,
     "chat template: render recursion (blocks, expressions, macro bodies)"},
    {"regex.match_steps", &InputLimits::regex_match_steps, 4294967295,
     "tokenizer.json regexes: PCRE2 match steps per match"},
    {"regex.depth", &InputLimits::regex_depth, 4294967295,
     "tokenizer.json regexes: PCRE2 backtracking depth"},
    {"regex.heap_mib", &InputLimits::regex_heap_mib, 65536,
     "tokenizer.json regexes: MiB of PCRE2's backtracking heap"},
    {"json.nesting", &InputLimits::json_nesting, 10000,
     "JSON files and lines: arrays and objects nested in each other"},
};

std::string names() {
  std::string s;
  for (const auto& e : kEntries) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

}  // namespace

const InputLimits& input_limits() { return mutable_limits(); }

void set_input_limit(const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string name = assignment.substr(0, eq);
  const Entry* entry = nullptr;
  for (const auto& e : kEntries) {
    if (name == e.name) entry = &e;
  }
  if (eq == std::string::npos || entry == nullptr) {
    throw UserError("--limit '" + assignment + "': expected NAME=VALUE with NAME one of " +
                    names());
  }
  const std::string text = assignment.substr(eq + 1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > entry->max) {
    throw UserError("--limit " + name + ": '" + text + "' is not an integer from 1 to " +
                    std::to_string(entry->max));
  }
  mutable_limits().*(entry->field) = value;
}

std::vector<InputLimitInfo> describe_input_limits() {
  std::vector<InputLimitInfo> out;
  for (const auto& e : kEntries) out.push_back({e.name, input_limits().*(e.field), e.max, e.what});
  return out;
}

std::string raise_hint(const std::string& name) {
  return " (moe-train --limit " + name + "=N raises it)";
}

}  // namespace moe
