#include "template_budget.h"

#include <algorithm>

#include "moe/util/input_limits.h"

namespace moe::chat {

int max_nesting() { return static_cast<int>(input_limits().template_nesting); }
int64_t max_range() { return input_limits().template_range_items; }
int64_t max_loop_iterations() { return input_limits().template_loop_iterations; }
int64_t max_macro_calls() { return input_limits().template_macro_calls; }
size_t max_text_bytes() { return static_cast<size_t>(input_limits().template_text_mib) << 20; }
int64_t max_built_items() { return input_limits().template_built_items; }
size_t max_built_bytes() { return static_cast<size_t>(input_limits().template_built_mib) << 20; }
int max_render_depth() { return static_cast<int>(input_limits().template_render_depth); }

std::string too_deep_message(const std::string& what, int limit, const std::string& limit_name) {
  return what + " nested more than " + std::to_string(limit) +
         " levels deep (the template sandbox's limit)" + raise_hint(limit_name);
}

std::optional<std::string> RenderBudget::text(size_t bytes) {
  if (bytes <= max_text_bytes()) return std::nullopt;
  return "text of " + std::to_string(bytes) + " bytes: more than the template sandbox's " +
         std::to_string(max_text_bytes() >> 20) + " MiB" + raise_hint("template.text_mib");
}

std::optional<std::string> RenderBudget::built(const Json& v) {
  if (measure(v, 0) > max_nesting()) {
    return "lists or dicts nested more than " + std::to_string(max_nesting()) +
           " deep: the template sandbox's limit" + raise_hint("template.nesting");
  }
  if (built_items_ > max_built_items() || built_bytes_ > max_built_bytes()) {
    return "more than the template sandbox's " + std::to_string(max_built_items()) + " items or " +
           std::to_string(max_built_bytes() >> 20) +
           " MiB of strings in the lists and dicts built in one rendering" +
           raise_hint(built_items_ > max_built_items() ? "template.built_items"
                                                       : "template.built_mib");
  }
  return std::nullopt;
}

// The nesting of `v` (at `depth`), its items and string bytes added to the budget's counts;
// stops early past either limit.
int RenderBudget::measure(const Json& v, int depth) {
  if (v.is_string()) built_bytes_ += v.get_ref<const std::string&>().size();
  if (!v.is_structured() || depth > max_nesting() || built_items_ > max_built_items()) return depth;
  int deepest = depth + 1;
  for (const auto& x : v) {
    ++built_items_;
    deepest = std::max(deepest, measure(x, depth + 1));
  }
  return deepest;
}

std::optional<std::string> RenderBudget::loop_iteration() {
  if (++iterations_ <= max_loop_iterations()) return std::nullopt;
  return "more than " + std::to_string(max_loop_iterations()) +
         " loop iterations in one rendering (the template sandbox's limit)" +
         raise_hint("template.loop_iterations");
}

std::optional<std::string> RenderBudget::macro_call() {
  if (++macro_calls_ <= max_macro_calls()) return std::nullopt;
  return "more than " + std::to_string(max_macro_calls()) +
         " macro calls in one rendering (the template sandbox's limit)" +
         raise_hint("template.macro_calls");
}

}  // namespace moe::chat
