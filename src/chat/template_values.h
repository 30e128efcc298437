// The chat-template engine's values as Python shows them: truthiness, str() and repr(), code
// points, and macros as values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "template_ast.h"

namespace moe::chat {

// Python's bool(value); undefined is false.
bool truthy(const Value& x);

// The code points of UTF-8 text (a sequence cut short: its bytes), and back.
std::vector<uint32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<uint32_t>& cps);

// repr(float) as Python prints it.
std::string python_float(double d);
// repr(s) of a Python str.
std::string python_str_repr(const std::string& s);
// repr(value) of the Python list, dict or scalar `v` is.
std::string python_repr(const Json& v);
// str(value) as Python prints it.
std::string to_text(const Value& x);

// A macro is a value too (a name {% macro %} binds, passed around like one): JSON binary whose
// bytes are its name and whose subtype indexes the renderer's macros. A macro's parameter given
// no value is bound to binary without a subtype, which reads as undefined. (JSON from the
// context never holds binary.)
bool is_macro(const Json& v);
bool is_unbound(const Json& v);
std::string macro_name(const Json& v);

// obj.name (and obj["name"]): a mapping's item, else undefined.
Value attribute(const Value& obj, const std::string& name);

}  // namespace moe::chat
