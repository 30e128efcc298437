// The chat-template engine's renderer: the parsed template executed over the context's
// variables, within the sandbox's budgets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "template_ast.h"
#include "template_budget.h"

namespace moe::chat {

class Renderer {
 public:
  Renderer(const std::string& origin, const Json& context,
           std::vector<std::pair<size_t, size_t>>* generation);

  void run(const Body& body);
  std::string& output() { return out_; }

  // For the builtins (template_builtins.h):
  Value eval(const Expr& e, int line);
  // The keyword argument `key` of the call `e`, evaluated; undefined when not given.
  Value kwarg(const Expr& e, const std::string& key, int line);
  // UserError naming the template and `line` (none when 0).
  [[noreturn]] void fail(int line, const std::string& what) const;
  // The sandbox's size budget for the output and for every string value built.
  void check_size(size_t bytes, int line) const;
  // The sandbox's budget for the lists and dicts built: `v` was just built.
  void charge_built(const Json& v, int line);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // ---- statements (template_eval.cpp) ----
  void emit(const std::string& text, int line);
  Value lookup(const std::string& name) const;
  Json* find_variable(const std::string& name);
  Flow exec(const Body& body);
  [[noreturn]] void too_deep(int line) const;
  Flow exec(const Node& n);
  Flow exec_node(const Node& n);
  template <typename Fn>
  std::string capture(Fn&& body);
  void define_macro(const Node& n);
  Value call_macro(const Json& callee, std::vector<Value> a, const Expr& e, int line);
  void assign(const Node& n, Json v);
  Flow exec_for(const Node& n);
  void bind(const Node& n, const Json& item);

  // ---- expressions (template_eval_expr.cpp) ----
  Value eval_node(const Expr& e, int line);
  Value index(const Value& obj, const Value& key, int line);
  Value slice(const Expr& e, int line);
  std::vector<Value> arguments(const Expr& e, int line, size_t first);
  Value call(const Expr& e, int line);
  Json* mutable_list(const Expr& e);
  Value mutate_list(Json& list, const std::string& method, const std::vector<Value>& a, int line);
  Value filter(const Expr& e, int line);
  bool test(const Expr& e, int line);
  Value binary(const Expr& e, int line);
  std::optional<Value> compare_or_concatenate(const std::string& op, const Value& a, const Value& b,
                                              int line);
  Value repeat_string(const std::string& op, const Value& a, const Value& b, int line) const;
  Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) const;
  std::optional<Value> integer_arithmetic(const std::string& op, int64_t i, int64_t j,
                                          int line) const;

  const std::string& origin_;
  std::vector<std::pair<size_t, size_t>>* generation_;
  std::vector<std::map<std::string, Json>> scopes_;
  std::string out_;
  struct Macro {
    const Node* node;  // its {% macro %}
    size_t depth;      // the scopes open where it was defined: those it sees
  };
  std::vector<Macro> macros_;   // those defined so far (a binary value's subtype indexes them)
  RenderBudget budget_;         // loop iterations, macro calls, lists and dicts built
  int macro_depth_ = 0;         // macro calls within macro calls now
  int render_depth_ = 0;        // eval and exec calls within each other now (max_render_depth())
  size_t suspended_bytes_ = 0;  // the output held by the macro calls and set blocks rendering
};

}  // namespace moe::chat
