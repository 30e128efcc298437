// The chat-template engine's parsers: expressions (one tag's tokens) and the template's blocks.
#pragma once

#include <string>
#include <vector>

#include "template_ast.h"
#include "template_lexer.h"

namespace moe::chat {

// A recursive-descent parser of one tag's tokens (Jinja's precedence: or, and, not,
// comparisons and tests, ~, + -, * / // %, unary minus, filters, postfix, primaries). Its
// nesting stops at max_nesting() (a SyntaxError, not a stack overflow).
class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line);

  ExprPtr expression();
  // For parsing "for x, y in": an or-expression without the ternary.
  ExprPtr or_expr();
  bool is_name(const char* n) const;
  bool is_op(const char* o) const;
  bool at_end() const;
  void expect_op(const char* o);
  std::string name();
  [[noreturn]] void fail(const std::string& expected) const;

 private:
  [[noreturn]] void too_deep() const;
  static ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b);
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr test(ExprPtr e);
  ExprPtr concat();
  ExprPtr additive();
  ExprPtr multiplicative();
  ExprPtr unary();
  ExprPtr filtered();
  void call_args(Expr& into);
  ExprPtr postfix(ExprPtr e);
  ExprPtr subscript(ExprPtr e);
  ExprPtr primary();
  ExprPtr bracketed();

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;  // nesting of the parse calls (NestingGuard)
};

// The statements of the template's pieces (split_template); SyntaxError on bad syntax or an
// unsupported tag.
Body parse_template(std::vector<Piece> pieces);

}  // namespace moe::chat
