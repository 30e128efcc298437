// The chat-template engine's builtins, each a table of name -> function: the global functions
// (raise_exception, namespace, range, ...), the tests (`is defined`), the filters (`|tojson`) and
// the methods of strings and mappings (`.startswith()`, `.items()`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "template_ast.h"

namespace moe::chat {

class Renderer;
using Args = std::vector<Value>;

// A global function: the renderer, its name, the positional arguments, the call, the line.
using Function = Value (*)(Renderer& r, const std::string& name, const Args& a, const Expr& e,
                           int line);
// A test: the renderer, its name, the value tested, the test's expression, the line.
using Test = bool (*)(Renderer& r, const std::string& name, const Value& x, const Expr& e,
                      int line);
// A filter: the renderer, its name, the value filtered, the positional arguments, the call, the
// line.
using Filter = Value (*)(Renderer& r, const std::string& name, const Value& x, const Args& a,
                         const Expr& e, int line);

// The builtin of that name, or null.
Function find_function(std::string_view name);
Test find_test(std::string_view name);
Filter find_filter(std::string_view name);

// obj.name(a...): a method of strings or of mappings; UserError (through `r`) for another.
Value call_method(const Renderer& r, const Value& obj, const std::string& name, const Args& a,
                  int line);

}  // namespace moe::chat
