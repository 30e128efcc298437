#include "template_budget.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <vector>

#include "moe/util/input_limits.h"
#include "template_lexer.h"

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

namespace {

// The name at s[i] (within [i, to)), i moved past it; empty when none stands there. Blanks
// before it are skipped, as the lexer skips them.
std::string_view name_at(const std::string& s, size_t& i, size_t to) {
  while (i < to && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  const size_t from = i;
  if (i < to && is_name_start(s[i])) {
    while (i < to && is_name_char(s[i])) ++i;
  }
  return std::string_view(s).substr(from, i - from);
}

// Whether {% set ... %} (from s[i], after its keyword) opens a block: no '=' after its target
// ("name" or "name.attr"), as the parser reads it. Nullopt: no target (the parser refuses it).
std::optional<bool> set_opens_block(const std::string& s, size_t i, size_t to) {
  if (name_at(s, i, to).empty()) return std::nullopt;
  while (i < to && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i < to && s[i] == '.') {
    if (name_at(s, ++i, to).empty()) return std::nullopt;
    while (i < to && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  return !(i < to && s[i] == '=' && (i + 1 >= to || s[i + 1] != '='));
}

// A statement's effect on the blocks open (their kinds: 'i' if, 'f' for, 's' set, 'm' macro,
// 'g' generation; 'I' and 'F' an if or for past its else), as the parser takes it; false where
// the parser refuses the statement.
bool apply_statement(std::vector<char>& open, std::string_view keyword, const std::string& s,
                     size_t i, size_t to) {
  static const std::string_view kinds[] = {"if", "for", "set", "macro", "generation"};
  const char top = open.empty() ? '\0' : open.back();
  for (std::string_view k : kinds) {
    if (keyword == k) {
      const std::optional<bool> block = k == "set" ? set_opens_block(s, i, to) : true;
      if (block && *block) open.push_back(k[0]);
      return block.has_value();
    }
    if (keyword.size() == k.size() + 3 && keyword.substr(0, 3) == "end" && keyword.substr(3) == k) {
      if (top != k[0] && top != std::toupper(k[0])) return false;  // an end of another block
      open.pop_back();
      return true;
    }
  }
  if (keyword == "elif") return top == 'i';
  if (keyword == "else" && (top == 'i' || top == 'f')) {
    open.back() = static_cast<char>(std::toupper(top));
    return true;
  }
  return keyword == "break" || keyword == "continue";
}

}  // namespace

void check_block_nesting(const std::string& src) {
  if (max_nesting() < 1) return;  // the parser refuses the template's body itself
  const auto limit = static_cast<size_t>(max_nesting());
  std::vector<char> open;          // the kinds of the blocks open here (fewer than `limit`)
  std::optional<size_t> too_deep;  // where the block past the limit opens
  for (std::optional<Tag> tag = next_tag(src, 0); tag; tag = next_tag(src, tag->end + 2)) {
    if (tag->end == std::string::npos) return;   // the split names the unclosed tag first
    if (too_deep || tag->kind != '%') continue;  // past the limit: only an unclosed tag counts
    size_t at = tag->body_from;
    const std::string_view keyword = name_at(src, at, tag->body_to);
    if (!apply_statement(open, keyword, src, at, tag->body_to)) return;  // the parser names it
    if (open.size() + 1 > limit) too_deep = tag->open;  // the parser counts the body as 1
  }
  if (!too_deep) return;
  const auto newlines =
      std::count(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(*too_deep), '\n');
  throw SyntaxError{static_cast<int>(newlines) + 1,
                    too_deep_message("blocks", max_nesting(), "template.nesting")};
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
