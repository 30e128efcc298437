#include <charconv>
#include <cstdlib>

#include "moe/util/input_limits.h"
#include "template_budget.h"
#include "template_parser.h"

namespace moe::chat {

ExprParser::ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

ExprPtr ExprParser::expression() {
  NestingGuard guard(depth_, [this] { too_deep(); });
  ExprPtr e = or_expr();
  if (is_name("if")) {  // a if cond else b
    ++p_;
    auto t = make_expr(Expr::kTernary);
    ExprPtr cond = or_expr();
    ExprPtr other;
    if (is_name("else")) {
      ++p_;
      other = expression();
    } else {
      other = make_expr(Expr::kLiteral);  // Jinja: undefined, which renders as ""
      other->literal = Json();
      other->name = "undefined";
    }
    t->args.push_back(std::move(cond));
    t->args.push_back(std::move(e));
    t->args.push_back(std::move(other));
    return t;
  }
  return e;
}
bool ExprParser::is_name(const char* n) const {
  return t_[p_].kind == Token::kName && t_[p_].text == n;
}
bool ExprParser::is_op(const char* o) const {
  return t_[p_].kind == Token::kOp && t_[p_].text == o;
}
bool ExprParser::at_end() const { return t_[p_].kind == Token::kEnd; }
void ExprParser::expect_op(const char* o) {
  if (!is_op(o)) fail(std::string("'") + o + "'");
  ++p_;
}
std::string ExprParser::name() {
  if (t_[p_].kind != Token::kName) fail("a name");
  return t_[p_++].text;
}
void ExprParser::too_deep() const {
  throw SyntaxError{line_, too_deep_message("expressions", max_nesting(), "template.nesting")};
}
void ExprParser::fail(const std::string& expected) const {
  throw SyntaxError{
      line_, "expected " + expected + (at_end() ? " at the end" : " before '" + t_[p_].text + "'")};
}
// For parsing "for x, y in": an or-expression without the ternary.
ExprPtr ExprParser::or_expr() {
  ExprPtr e = and_expr();
  while (is_name("or")) {
    ++p_;
    e = binary("or", std::move(e), and_expr());
  }
  return e;
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr a, ExprPtr b) {
  auto e = make_expr(Expr::kBinary, op);
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}
ExprPtr ExprParser::and_expr() {
  ExprPtr e = not_expr();
  while (is_name("and")) {
    ++p_;
    e = binary("and", std::move(e), not_expr());
  }
  return e;
}
ExprPtr ExprParser::not_expr() {
  if (is_name("not")) {
    NestingGuard guard(depth_, [this] { too_deep(); });
    ++p_;
    auto e = make_expr(Expr::kNot);
    e->args.push_back(not_expr());
    return e;
  }
  return compare();
}
ExprPtr ExprParser::compare() {
  ExprPtr e = concat();
  for (;;) {
    static const char* const ops[] = {"==", "!=", "<", ">", "<=", ">="};
    bool matched = false;
    for (const char* op : ops) {
      if (is_op(op)) {
        ++p_;
        e = binary(op, std::move(e), concat());
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (is_name("in")) {
      ++p_;
      e = binary("in", std::move(e), concat());
    } else if (is_name("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].text == "in") {
      p_ += 2;
      e = binary("not in", std::move(e), concat());
    } else if (is_name("is")) {
      ++p_;
      e = test(std::move(e));
    } else {
      return e;
    }
  }
}
// "e is [not] name", "is name(args)" or "is name value"; after "is".
ExprPtr ExprParser::test(ExprPtr e) {
  auto t = make_expr(Expr::kTest);
  if (is_name("not")) {
    ++p_;
    t->negated = true;
  }
  t->name = name();
  t->args.push_back(std::move(e));
  if (is_op("(")) {
    call_args(*t);
  } else if (!at_end() && t_[p_].kind != Token::kOp && !is_name("and") && !is_name("or") &&
             !is_name("else") && !is_name("if")) {
    t->args.push_back(primary());  // "is sameas x", "is equalto 3"
  }
  return t;
}

ExprPtr ExprParser::concat() {
  ExprPtr e = additive();
  while (is_op("~")) {
    ++p_;
    e = binary("~", std::move(e), additive());
  }
  return e;
}
ExprPtr ExprParser::additive() {
  ExprPtr e = multiplicative();
  while (is_op("+") || is_op("-")) {
    const std::string op = t_[p_++].text;
    e = binary(op, std::move(e), multiplicative());
  }
  return e;
}
ExprPtr ExprParser::multiplicative() {
  ExprPtr e = unary();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = t_[p_++].text;
    e = binary(op, std::move(e), unary());
  }
  return e;
}
ExprPtr ExprParser::unary() {
  if (is_op("-")) {
    NestingGuard guard(depth_, [this] { too_deep(); });
    ++p_;
    auto e = make_expr(Expr::kNeg);
    e->args.push_back(unary());
    return e;
  }
  if (is_op("+")) ++p_;
  return filtered();
}
ExprPtr ExprParser::filtered() {
  ExprPtr e = postfix(primary());
  while (is_op("|")) {
    ++p_;
    auto f = make_expr(Expr::kFilter, name());
    f->args.push_back(std::move(e));
    if (is_op("(")) call_args(*f);
    e = std::move(f);
  }
  return e;
}
void ExprParser::call_args(Expr& into) {
  expect_op("(");
  while (!is_op(")")) {
    if (t_[p_].kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].text == "=") {
      std::string key = name();
      ++p_;
      into.kwargs.emplace_back(std::move(key), expression());
    } else {
      into.args.push_back(expression());
    }
    if (!is_op(",")) break;
    ++p_;
  }
  expect_op(")");
}
ExprPtr ExprParser::postfix(ExprPtr e) {
  for (;;) {
    if (is_op(".")) {
      ++p_;
      auto a = make_expr(Expr::kAttr, name());
      a->args.push_back(std::move(e));
      e = std::move(a);
    } else if (is_op("[")) {
      e = subscript(std::move(e));
    } else if (is_op("(")) {
      auto c = make_expr(Expr::kCall);
      c->args.push_back(std::move(e));
      call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}
// e[index] or e[start:stop:step] (any part omitted); at the '['.
ExprPtr ExprParser::subscript(ExprPtr e) {
  ++p_;
  ExprPtr parts[3];
  int colons = 0;
  while (!is_op("]")) {
    if (is_op(":")) {
      if (++colons > 2) fail("']'");
      ++p_;
      continue;
    }
    parts[colons] = expression();
  }
  expect_op("]");
  auto s = make_expr(colons == 0 ? Expr::kIndex : Expr::kSlice);
  s->args.push_back(std::move(e));
  for (auto& part : parts) s->args.push_back(std::move(part));  // null: omitted
  if (colons == 0 && !s->args[1]) fail("an index");
  return s;
}

ExprPtr ExprParser::primary() {
  const Token& t = t_[p_];
  auto lit = [&](Json v) {
    ++p_;
    auto e = make_expr(Expr::kLiteral);
    e->literal = std::move(v);
    return e;
  };
  switch (t.kind) {
    case Token::kString: {
      std::string s = t.text;
      ++p_;
      while (t_[p_].kind == Token::kString) s += t_[p_++].text;  // adjacent literals join
      auto e = make_expr(Expr::kLiteral);
      e->literal = s;
      return e;
    }
    case Token::kInt: {
      // Python's ints are unbounded; a template's literals must fit 64 bits here.
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (ec != std::errc() || end != t.text.data() + t.text.size()) {
        throw SyntaxError{line_, "an integer literal beyond 64 bits"};
      }
      return lit(Json(v));
    }
    case Token::kFloat:
      return lit(Json(std::strtod(t.text.c_str(), nullptr)));  // too large: inf, as Python
    case Token::kName:
      if (t.text == "true" || t.text == "True") return lit(Json(true));
      if (t.text == "false" || t.text == "False") return lit(Json(false));
      if (t.text == "none" || t.text == "None") return lit(Json());
      ++p_;
      return make_expr(Expr::kName, t.text);
    case Token::kOp:
      return bracketed();
    case Token::kEnd:
      break;
  }
  fail("a value");
}

// A parenthesized expression or tuple, a list or a dict literal; at its opening.
ExprPtr ExprParser::bracketed() {
  const Token& t = t_[p_];
  if (t.text == "(") {
    ++p_;
    ExprPtr e = expression();
    if (is_op(",")) {  // a tuple: a list here
      auto list = make_expr(Expr::kList);
      list->args.push_back(std::move(e));
      while (is_op(",")) {
        ++p_;
        if (is_op(")")) break;
        list->args.push_back(expression());
      }
      e = std::move(list);
    }
    expect_op(")");
    return e;
  }
  if (t.text == "[") {
    ++p_;
    auto list = make_expr(Expr::kList);
    while (!is_op("]")) {
      list->args.push_back(expression());
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op("]");
    return list;
  }
  if (t.text == "{") {
    ++p_;
    auto dict = make_expr(Expr::kDict);
    while (!is_op("}")) {
      dict->args.push_back(expression());
      expect_op(":");
      dict->args.push_back(expression());
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op("}");
    return dict;
  }
  fail("a value");
}

}  // namespace moe::chat
