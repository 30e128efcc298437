// The chat-template engine's shared types (chat_template.h is its public face): values, the
// parsed expressions and statements, and the syntax error the parser throws.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/chat/chat_template.h"

namespace moe::chat {

using Json = nlohmann::ordered_json;

// A template value: JSON, or Jinja's undefined (a missing variable, key or attribute).
struct Value {
  Json v;
  bool undefined = false;
  static Value undef() { return {Json(), true}; }
};

struct SyntaxError {
  int line;
  std::string what;
};

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kTernary
  } kind;
  Json literal;
  std::string name;                         // kName, kAttr, kFilter, kTest, kBinary (operator)
  std::vector<std::unique_ptr<Expr>> args;  // operands / elements / call arguments
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  bool negated = false;  // kTest: "is not"
};
using ExprPtr = std::unique_ptr<Expr>;

inline ExprPtr make_expr(Expr::Kind kind, std::string name = "") {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  return e;
}

struct ChatTemplate::Node {
  enum Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kBreak,
    kContinue,
    kGeneration,
    kMacro
  } kind;
  int line = 0;
  std::string text;                  // kText; kSet/kSetBlock: the variable; kMacro: the name
  std::string attribute;             // kSet: "ns.attr" assigns attr of ns
  std::vector<std::string> targets;  // kFor: the loop variables; kMacro: the parameters
  std::vector<ExprPtr> defaults;     // kMacro: each parameter's default (null: none)
  ExprPtr expr;                      // kOutput, kSet, kFor (iterable)
  ExprPtr loop_filter;               // kFor: "for x in xs if cond"
  std::vector<std::pair<ExprPtr, std::vector<std::unique_ptr<Node>>>> branches;  // kIf
  std::vector<std::unique_ptr<Node>> body, else_body;  // kFor, kSetBlock, kGeneration, kMacro
};

using Body = std::vector<std::unique_ptr<ChatTemplate::Node>>;
using Node = ChatTemplate::Node;

}  // namespace moe::chat
