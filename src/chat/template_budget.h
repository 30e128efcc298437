// The template sandbox's budgets (docs/reliability.md): a downloaded template cannot exhaust the
// stack, memory or time. Real templates nest a few levels, loop over messages and tools, and
// write kilobytes; Jinja2's own sandbox caps range() at 100,000 items (MAX_RANGE).
// Each is read from the process's input limits (util/input_limits.h): `moe-train --limit
// template.NAME=N` raises one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "template_ast.h"

namespace moe::chat {

int max_nesting();              // expressions in expressions, blocks in blocks, macro calls
int64_t max_range();            // items of one range()
int64_t max_loop_iterations();  // in one render
int64_t max_macro_calls();      // in one render
size_t max_text_bytes();        // the output, and any one string value
// What the lists and dicts one render builds (literals, list + list) hold in all: their items, and
// the bytes of their strings. Each is a copy of its parts, so a value doubled in a loop would
// otherwise take gigabytes, and one wrapped in itself nest past the stack (nesting: max_nesting).
int64_t max_built_items();
size_t max_built_bytes();
// The renderer's recursion (an expression evaluated within another, a block within a block, a
// macro's body within its call), all together: with macros calling macros the parse limits no
// longer bound it. Real templates stay within a few dozen levels; 2,000 take under 2 MiB of the
// stack (a thread has 8).
int max_render_depth();

// "<what> nested more than <limit> levels deep (the template sandbox's limit)", with the hint
// of the input limit `limit_name` that raises it.
std::string too_deep_message(const std::string& what, int limit, const std::string& limit_name);

// Counts one level of nesting for the life of a parse (or render) call; past `limit`, `fail` is
// called.
class NestingGuard {
 public:
  template <typename Fail>
  NestingGuard(int& depth, Fail&& fail, int limit = max_nesting()) : depth_(depth) {
    if (++depth_ > limit) {
      --depth_;
      fail();
    }
  }
  ~NestingGuard() { --depth_; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;

 private:
  int& depth_;
};

// The blocks' nesting in `src`, counted over its tags in one pass (linear in its size) before
// anything else reads it: SyntaxError (the line of the block past the limit, the parser's
// message) where the parser would refuse it. What it knows the split or the parser refuses
// first (an unclosed tag anywhere; before the block past the limit, an end tag of another block,
// an unknown keyword) it leaves to them, so that they name it.
void check_block_nesting(const std::string& src);

// What one rendering has spent of the budgets that add up over it. Each count returns the
// message of the limit it passed, or nothing.
class RenderBudget {
 public:
  // A text (the output, or a string built) of `bytes`.
  static std::optional<std::string> text(size_t bytes);
  // `v`, a list or dict just built: its nesting, items and string bytes. Walking it costs what
  // copying it did.
  std::optional<std::string> built(const Json& v);
  std::optional<std::string> loop_iteration();
  std::optional<std::string> macro_call();

 private:
  int measure(const Json& v, int depth);

  int64_t iterations_ = 0;   // for-loop iterations so far in this rendering
  int64_t macro_calls_ = 0;  // macro calls so far in this rendering
  int64_t built_items_ = 0;  // items of the lists and dicts built so far (max_built_items())
  size_t built_bytes_ = 0;   // their strings' bytes (max_built_bytes())
};

}  // namespace moe::chat
