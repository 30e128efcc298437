// The budgets of the parsers that read downloaded or remote input (docs/reliability.md): the chat
// template sandbox, the tokenizer's PCRE2 matches and the JSON nesting checked before nlohmann
// parses. Process-wide: the command line sets them once (`moe-train --limit NAME=VALUE ...`),
// before anything is parsed; every parser reads them from here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

struct InputLimits {
  // Chat templates (Jinja): nesting of expressions, blocks, macro calls and built lists.
  int64_t template_nesting = 200;
  int64_t template_range_items = 100000;  // Jinja2's sandbox MAX_RANGE
  int64_t template_loop_iterations = 1000000;
  int64_t template_macro_calls = 1000000;
  int64_t template_text_mib = 64;  // the output and any one string built
  int64_t template_built_items = 1000000;
  int64_t template_built_mib = 256;
  int64_t template_render_depth = 2000;
  // tokenizer.json's pre-tokenizer regexes (PCRE2 match context).
  int64_t regex_match_steps = 10000000;
  int64_t regex_depth = 100000;
  int64_t regex_heap_mib = 256;
  // JSON files and lines (configs, tokenizer.json, manifests, SFT JSONL).
  int64_t json_nesting = 512;
};

// The limits in force (the defaults above until set_input_limit changes one).
const InputLimits& input_limits();

// "template.range_items=1000000": sets one limit. UserError naming the argument, the limit and
// its allowed range for an unknown name, a value that is not an integer, or one out of range
// (the recursion limits stop where the thread's stack would).
void set_input_limit(const std::string& assignment);

struct InputLimitInfo {
  std::string name;  // as --limit spells it
  int64_t value;     // in force now
  int64_t max;       // the largest value --limit accepts
  std::string what;  // one line
};
std::vector<InputLimitInfo> describe_input_limits();

// " (moe-train --limit NAME=N raises it)": the tail every limit's error message ends with.
std::string raise_hint(const std::string& name);

}  // namespace moe
