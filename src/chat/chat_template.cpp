#include "moe/chat/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <unicode/uchar.h>

#include "moe/tokenizers/tokenizer.h"
#include "moe/tokenizers/utf8.h"
#include "moe/util/errors.h"
#include "moe/util/input_limits.h"

namespace moe::data {

namespace {

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

// The sandbox's budgets (docs/reliability.md): a downloaded template cannot exhaust the stack,
// memory or time. Real templates nest a few levels, loop over messages and tools, and write
// kilobytes; Jinja2's own sandbox caps range() at 100,000 items (MAX_RANGE).
// Each is read from the process's input limits (util/input_limits.h): `moe-train --limit
// template.NAME=N` raises one.
int max_nesting() {  // expressions in expressions, blocks in blocks, macro calls
  return static_cast<int>(input_limits().template_nesting);
}
int64_t max_range() { return input_limits().template_range_items; }  // items of one range()
int64_t max_loop_iterations() { return input_limits().template_loop_iterations; }  // one render
int64_t max_macro_calls() { return input_limits().template_macro_calls; }          // in one render
size_t max_text_bytes() {  // the output, and any one string value
  return static_cast<size_t>(input_limits().template_text_mib) << 20;
}
// What the lists and dicts one render builds (literals, list + list) hold in all: their items, and
// the bytes of their strings. Each is a copy of its parts, so a value doubled in a loop would
// otherwise take gigabytes, and one wrapped in itself nest past the stack (nesting: max_nesting).
int64_t max_built_items() { return input_limits().template_built_items; }
size_t max_built_bytes() { return static_cast<size_t>(input_limits().template_built_mib) << 20; }
// The renderer's recursion (an expression evaluated within another, a block within a block, a
// macro's body within its call), all together: with macros calling macros the parse limits no
// longer bound it. Real templates stay within a few dozen levels; 2,000 take under 2 MiB of the
// stack (a thread has 8).
int max_render_depth() { return static_cast<int>(input_limits().template_render_depth); }

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

// ---- expressions --------------------------------------------------------------------------

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// A name at s[i]; i moves past it.
Token lex_name(const std::string& s, size_t& i) {
  size_t j = i;
  while (j < s.size() && is_name_char(s[j])) ++j;
  Token t{Token::kName, s.substr(i, j - i)};
  i = j;
  return t;
}

// An integer or a float (digits, a point, digits) at s[i]; i moves past it.
Token lex_number(const std::string& s, size_t& i) {
  size_t j = i;
  bool real = false;
  while (j < s.size() && (is_digit(s[j]) || s[j] == '.')) {
    if (s[j] == '.') {
      if (j + 1 >= s.size() || !is_digit(s[j + 1])) break;
      real = true;
    }
    ++j;
  }
  Token t{real ? Token::kFloat : Token::kInt, s.substr(i, j - i)};
  i = j;
  return t;
}

// The escape whose letter is s[j] (after a backslash) onto str; j moves to its last character.
void append_escape(const std::string& s, size_t& j, std::string& str, int line) {
  const char e = s[j];
  if (e == 'n') {
    str += '\n';
  } else if (e == 't') {
    str += '\t';
  } else if (e == 'r') {
    str += '\r';
  } else if (e == 'u') {
    // Four hex digits, as Python's unicode-escape (Jinja2) requires.
    uint32_t cp = 0;
    for (size_t k = j + 1; k <= j + 4; ++k) {
      if (k >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[k]))) {
        throw SyntaxError{line, "a truncated \\uXXXX escape (four hex digits expected)"};
      }
      const int c = std::tolower(static_cast<unsigned char>(s[k]));
      cp = cp * 16 + static_cast<uint32_t>(is_digit(static_cast<char>(c)) ? c - '0' : c - 'a' + 10);
    }
    utf8::append(str, cp);
    j += 4;
  } else {
    str += e;  // \\ \' \" and anything else: the character itself
  }
}

// A quoted string at s[i]; i moves past its closing quote.
Token lex_string(const std::string& s, size_t& i, int line) {
  const char quote = s[i];
  std::string str;
  size_t j = i + 1;
  for (; j < s.size() && s[j] != quote; ++j) {
    if (s[j] != '\\' || j + 1 >= s.size()) {
      str += s[j];
      continue;
    }
    append_escape(s, ++j, str, line);
  }
  if (j >= s.size()) throw SyntaxError{line, "an unterminated string"};
  i = j + 1;
  return {Token::kString, str};
}

// An operator of one or two characters at s[i]; i moves past it.
Token lex_operator(const std::string& s, size_t& i, int line) {
  static const char* const two[] = {"==", "!=", "<=", ">=", "//", "**"};
  const char c = s[i];
  std::string op(1, c);
  for (const char* t : two) {
    if (s.compare(i, 2, t) == 0) op = t;
  }
  if (std::string("+-*/%~|.,:()[]{}<>=!").find(c) == std::string::npos) {
    throw SyntaxError{line, std::string("an unexpected character '") + c + "'"};
  }
  i += op.size();
  return {Token::kOp, op};
}

std::vector<Token> lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (is_name_start(c)) {
      out.push_back(lex_name(s, i));
    } else if (is_digit(c)) {
      out.push_back(lex_number(s, i));
    } else if (c == '\'' || c == '"') {
      out.push_back(lex_string(s, i, line));
    } else {
      out.push_back(lex_operator(s, i, line));
    }
  }
  out.push_back({Token::kEnd, ""});
  return out;
}

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

ExprPtr make(Expr::Kind kind, std::string name = "") {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  return e;
}

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  ExprPtr expression() {
    NestingGuard guard(depth_, [this] { too_deep(); });
    ExprPtr e = or_expr();
    if (is_name("if")) {  // a if cond else b
      ++p_;
      auto t = make(Expr::kTernary);
      ExprPtr cond = or_expr();
      ExprPtr other;
      if (is_name("else")) {
        ++p_;
        other = expression();
      } else {
        other = make(Expr::kLiteral);  // Jinja: undefined, which renders as ""
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
  bool is_name(const char* n) const { return t_[p_].kind == Token::kName && t_[p_].text == n; }
  bool is_op(const char* o) const { return t_[p_].kind == Token::kOp && t_[p_].text == o; }
  bool at_end() const { return t_[p_].kind == Token::kEnd; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(std::string("'") + o + "'");
    ++p_;
  }
  std::string name() {
    if (t_[p_].kind != Token::kName) fail("a name");
    return t_[p_++].text;
  }
  [[noreturn]] void too_deep() const {
    throw SyntaxError{line_, "expressions nested more than " + std::to_string(max_nesting()) +
                                 " levels deep (the template sandbox's limit)" +
                                 raise_hint("template.nesting")};
  }
  [[noreturn]] void fail(const std::string& expected) const {
    throw SyntaxError{line_, "expected " + expected +
                                 (at_end() ? " at the end" : " before '" + t_[p_].text + "'")};
  }
  // For parsing "for x, y in": an or-expression without the ternary.
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      ++p_;
      e = binary("or", std::move(e), and_expr());
    }
    return e;
  }

 private:
  static ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::kBinary, op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      ++p_;
      e = binary("and", std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      NestingGuard guard(depth_, [this] { too_deep(); });
      ++p_;
      auto e = make(Expr::kNot);
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
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
        auto t = make(Expr::kTest);
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
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr concat() {
    ExprPtr e = additive();
    while (is_op("~")) {
      ++p_;
      e = binary("~", std::move(e), additive());
    }
    return e;
  }
  ExprPtr additive() {
    ExprPtr e = multiplicative();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[p_++].text;
      e = binary(op, std::move(e), multiplicative());
    }
    return e;
  }
  ExprPtr multiplicative() {
    ExprPtr e = unary();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[p_++].text;
      e = binary(op, std::move(e), unary());
    }
    return e;
  }
  ExprPtr unary() {
    if (is_op("-")) {
      NestingGuard guard(depth_, [this] { too_deep(); });
      ++p_;
      auto e = make(Expr::kNeg);
      e->args.push_back(unary());
      return e;
    }
    if (is_op("+")) ++p_;
    return filtered();
  }
  ExprPtr filtered() {
    ExprPtr e = postfix(primary());
    while (is_op("|")) {
      ++p_;
      auto f = make(Expr::kFilter, name());
      f->args.push_back(std::move(e));
      if (is_op("(")) call_args(*f);
      e = std::move(f);
    }
    return e;
  }
  void call_args(Expr& into) {
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
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::kAttr, name());
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
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
        auto s = make(colons == 0 ? Expr::kIndex : Expr::kSlice);
        s->args.push_back(std::move(e));
        for (auto& part : parts) s->args.push_back(std::move(part));  // null: omitted
        if (colons == 0 && !s->args[1]) fail("an index");
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Expr::kCall);
        c->args.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token& t = t_[p_];
    auto lit = [&](Json v) {
      ++p_;
      auto e = make(Expr::kLiteral);
      e->literal = std::move(v);
      return e;
    };
    switch (t.kind) {
      case Token::kString: {
        std::string s = t.text;
        ++p_;
        while (t_[p_].kind == Token::kString) s += t_[p_++].text;  // adjacent literals join
        auto e = make(Expr::kLiteral);
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
        return make(Expr::kName, t.text);
      case Token::kOp:
        if (t.text == "(") {
          ++p_;
          ExprPtr e = expression();
          if (is_op(",")) {  // a tuple: a list here
            auto list = make(Expr::kList);
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
          auto list = make(Expr::kList);
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
          auto dict = make(Expr::kDict);
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
        break;
      case Token::kEnd:
        break;
    }
    fail("a value");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;  // nesting of the parse calls (NestingGuard)
};

}  // namespace

// ---- statements ---------------------------------------------------------------------------

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

namespace {

using Body = std::vector<std::unique_ptr<ChatTemplate::Node>>;
using Node = ChatTemplate::Node;

struct Piece {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string body;
  int line;
};

// The next '{' at or after i that opens a tag ({{, {% or {#), or npos.
size_t find_tag_open(const std::string& src, size_t i) {
  size_t open = src.find('{', i);
  while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
         src[open + 1] != '%' && src[open + 1] != '#') {
    open = src.find('{', open + 1);
  }
  if (open + 1 >= src.size()) open = std::string::npos;
  return open;
}

// Whitespace control on the text after a tag: `-%}` strips all leading blanks, trim_blocks one
// newline after a block tag.
void trim_text_after_tag(std::string& text, bool strip_next, bool trim_next) {
  if (strip_next) {
    text.erase(0, text.find_first_not_of(" \t\r\n"));
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) text.clear();
  } else if (trim_next && !text.empty() && text[0] == '\n') {
    text.erase(0, 1);
  } else if (trim_next && text.compare(0, 2, "\r\n") == 0) {
    text.erase(0, 2);
  }
}

// Whitespace control on the text (from src[i]) before the tag at src[open]: `{%-` strips all
// trailing blanks, lstrip_blocks those before a block tag alone on its line.
void trim_text_before_tag(std::string& text, const std::string& src, size_t i, size_t open,
                          bool block, char modifier) {
  if (modifier == '-') {
    const size_t keep = text.find_last_not_of(" \t\r\n");
    text.erase(keep == std::string::npos ? 0 : keep + 1);
  } else if (block && modifier != '+') {
    // lstrip_blocks: the blanks between the start of the tag's source line and the tag go,
    // when nothing else (another tag) stands on the line before it.
    const size_t nl = open == 0 ? std::string::npos : src.rfind('\n', open - 1);
    const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
    const size_t blanks = open - line_start;
    if (line_start >= i && src.find_first_not_of(" \t", line_start) >= open) {
      text.erase(text.size() - std::min(blanks, text.size()));
    }
  }
}

// The template cut into text, {{ }} and {% %}, with Jinja's whitespace control and the
// trim_blocks and lstrip_blocks options transformers sets.
std::vector<Piece> split_template(const std::string& src) {
  std::vector<Piece> out;
  size_t i = 0;
  int line = 1;
  bool trim_next = false, strip_next = false;
  auto count_lines = [&](size_t from, size_t to) {
    line += static_cast<int>(std::count(src.begin() + static_cast<std::ptrdiff_t>(from),
                                        src.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
  };
  while (i <= src.size()) {
    const size_t open = find_tag_open(src, i);
    std::string text = src.substr(i, open == std::string::npos ? std::string::npos : open - i);
    trim_text_after_tag(text, strip_next, trim_next);
    const int text_line = line;
    if (open == std::string::npos) {
      out.push_back({Piece::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool block = kind == '%' || kind == '#';
    const char modifier = open + 2 < src.size() ? src[open + 2] : 0;
    trim_text_before_tag(text, src, i, open, block, modifier);
    out.push_back({Piece::kText, text, text_line});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = src.find(close, open + 2);
    count_lines(i, open);
    if (end == std::string::npos) throw SyntaxError{line, "an unclosed tag"};
    size_t body_from = open + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
    size_t body_to = end;
    strip_next = end > body_from && src[end - 1] == '-';
    if (strip_next) --body_to;
    trim_next = block;
    const std::string body = src.substr(body_from, body_to - body_from);
    if (kind != '#') out.push_back({kind == '{' ? Piece::kExpr : Piece::kStmt, body, line});
    count_lines(open, end);
    i = end + 2;
    if (i > src.size()) break;
  }
  return out;
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  // Statements until one of `ends` (its keyword goes to `found`); the whole input when empty.
  Body parse_body(const std::vector<std::string>& ends, std::string& found) {
    NestingGuard guard(depth_, [this] {
      throw SyntaxError{at_ == 0 ? 0 : pieces_[at_ - 1].line,
                        "blocks nested more than " + std::to_string(max_nesting()) +
                            " levels deep (the template sandbox's limit)" +
                            raise_hint("template.nesting")};
    });
    Body body;
    while (at_ < pieces_.size()) {
      const Piece& p = pieces_[at_++];
      if (p.kind == Piece::kText) {
        if (!p.body.empty()) {
          auto n = std::make_unique<Node>();
          n->kind = Node::kText;
          n->line = p.line;
          n->text = p.body;
          body.push_back(std::move(n));
        }
        continue;
      }
      ExprParser ex(lex(p.body, p.line), p.line);
      if (p.kind == Piece::kExpr) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->line = p.line;
        n->expr = ex.expression();
        if (!ex.at_end()) ex.fail("'}}'");
        body.push_back(std::move(n));
        continue;
      }
      const std::string keyword = ex.name();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        found = keyword;
        last_ = std::make_unique<ExprParser>(std::move(ex));
        return body;
      }
      body.push_back(statement(keyword, ex, p.line));
    }
    if (!ends.empty())
      throw SyntaxError{pieces_.empty() ? 0 : pieces_.back().line, "{% " + ends[0] + " %}"};
    return body;
  }

  std::unique_ptr<Node> statement(const std::string& keyword, ExprParser& ex, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string found;
    if (keyword == "if") {
      if_statement(*n, ex);
    } else if (keyword == "for") {
      for_statement(*n, ex);
    } else if (keyword == "set") {
      n->text = ex.name();
      if (ex.is_op(".")) {
        ex.expect_op(".");
        n->attribute = ex.name();
      }
      if (ex.is_op("=")) {
        ex.expect_op("=");
        n->kind = Node::kSet;
        n->expr = ex.expression();
      } else {
        n->kind = Node::kSetBlock;
        n->body = parse_body({"endset"}, found);
      }
    } else if (keyword == "macro") {
      macro_statement(*n, ex);
    } else if (keyword == "generation") {
      n->kind = Node::kGeneration;
      n->body = parse_body({"endgeneration"}, found);
    } else if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::kBreak : Node::kContinue;
    } else {
      throw SyntaxError{
          line, "a supported tag (if, for, set, macro, generation, break, continue), not '" +
                    keyword + "'"};
    }
    if (!ex.at_end() && n->kind != Node::kIf && n->kind != Node::kFor) ex.fail("'%}'");
    return n;
  }

  // {% if c %} ... {% elif c %} ... {% else %} ... {% endif %}
  void if_statement(Node& n, ExprParser& ex) {
    n.kind = Node::kIf;
    std::string found;
    ExprPtr cond = ex.expression();
    for (;;) {
      Body b = parse_body({"elif", "else", "endif"}, found);
      n.branches.emplace_back(std::move(cond), std::move(b));
      if (found == "elif") {
        cond = last_->expression();
        continue;
      }
      if (found == "else") n.else_body = parse_body({"endif"}, found);
      break;
    }
  }

  // {% for x[, y...] in xs [if cond] %} ... [{% else %} ...] {% endfor %}
  void for_statement(Node& n, ExprParser& ex) {
    n.kind = Node::kFor;
    std::string found;
    n.targets.push_back(ex.name());
    while (ex.is_op(",")) {
      ex.expect_op(",");
      n.targets.push_back(ex.name());
    }
    if (!ex.is_name("in")) ex.fail("'in'");
    ex.name();
    n.expr = ex.or_expr();
    if (ex.is_name("if")) {
      ex.name();
      n.loop_filter = ex.expression();
    }
    n.body = parse_body({"else", "endfor"}, found);
    if (found == "else") n.else_body = parse_body({"endfor"}, found);
  }

  // {% macro name(a, b=default, ...) %} ... {% endmacro %}: as Jinja2, a parameter without a
  // default may not follow one with a default.
  void macro_statement(Node& n, ExprParser& ex) {
    n.kind = Node::kMacro;
    n.text = ex.name();
    ex.expect_op("(");
    while (!ex.is_op(")")) {
      n.targets.push_back(ex.name());
      if (ex.is_op("=")) {
        ex.expect_op("=");
        n.defaults.push_back(ex.expression());
      } else if (!n.defaults.empty() && n.defaults.back()) {
        throw SyntaxError{n.line, "non-default argument '" + n.targets.back() +
                                      "' follows default argument (as Jinja2 refuses)"};
      } else {
        n.defaults.push_back(nullptr);
      }
      if (!ex.is_op(",")) break;
      ex.expect_op(",");
    }
    ex.expect_op(")");
    std::string found;
    n.body = parse_body({"endmacro"}, found);
  }

  std::vector<Piece> pieces_;
  size_t at_ = 0;
  int depth_ = 0;                     // blocks within blocks (NestingGuard)
  std::unique_ptr<ExprParser> last_;  // the parser of the tag that ended the last body
};

// ---- evaluation ---------------------------------------------------------------------------

bool truthy(const Value& x) {
  if (x.undefined) return false;
  const Json& v = x.v;
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    // A sequence cut short (text that is not UTF-8): its bytes, never past the end.
    if (i + utf8::length(static_cast<unsigned char>(s[i])) > s.size()) {
      out.push_back(static_cast<unsigned char>(s[i]));
      n = 1;
      continue;
    }
    out.push_back(utf8::decode(s, i, n));
  }
  return out;
}

std::string from_code_points(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t c : cps) utf8::append(out, c);
  return out;
}

std::string python_float(double d) {
  if (d == 0.0 && std::signbit(d)) return "-0.0";  // Python keeps the sign: repr(-0.0)
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
    return Json(static_cast<int64_t>(d)).dump() + ".0";
  }
  return Json(d).dump();
}

// Whether Python's str.isprintable() holds for code point c: all but the categories Cc, Cf, Cs,
// Co, Cn, Zl, Zp and Zs (the space U+0020 excepted).
bool python_printable(uint32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

// repr(s) of a Python str: in single quotes, or double quotes when s has a single quote and no
// double quote; the quote and backslash escaped; \t \n \r; other code points that are not
// printable (python_printable) as \xhh, \uhhhh or \Uhhhhhhhh.
std::string python_str_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  char hex[16];
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    uint32_t c = static_cast<unsigned char>(s[i]);
    n = 1;
    // A sequence cut short (text that is not UTF-8): its byte, as code_points reads it.
    if (c >= 0x80 && i + utf8::length(static_cast<unsigned char>(s[i])) <= s.size()) {
      c = utf8::decode(s, i, n);
    }
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < ' ' || c == 0x7f) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c < 0x7f || python_printable(c)) {
      out.append(s, i, n);
    } else {
      if (c <= 0xff) {
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
      } else if (c <= 0xffff) {
        std::snprintf(hex, sizeof hex, "\\u%04x", c);
      } else {
        std::snprintf(hex, sizeof hex, "\\U%08x", c);
      }
      out += hex;
    }
  }
  return out + q;
}

std::string python_repr(const Json& v);

// A macro is a value too (a name {% macro %} binds, passed around like one): JSON binary whose
// bytes are its name and whose subtype indexes the renderer's macros. A macro's parameter given
// no value is bound to binary without a subtype, which reads as undefined. (JSON from the
// context never holds binary.)
bool is_macro(const Json& v) { return v.is_binary() && v.get_binary().has_subtype(); }
bool is_unbound(const Json& v) { return v.is_binary() && !v.get_binary().has_subtype(); }
std::string macro_name(const Json& v) {
  const auto& bytes = v.get_binary();
  return std::string(bytes.begin(), bytes.end());
}

// str(value) as Python prints it.
std::string to_text(const Value& x) {
  if (x.undefined) return "";
  const Json& v = x.v;
  if (v.is_binary()) return is_macro(v) ? "<Macro '" + macro_name(v) + "'>" : "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return python_float(v.get<double>());
  if (v.is_number()) return v.dump();
  return python_repr(v);
}

std::string python_repr(const Json& v) {
  if (v.is_string()) return python_str_repr(v.get_ref<const std::string&>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      out += (first ? "" : ", ") + python_repr(Json(k)) + ": " + python_repr(e);
      first = false;
    }
    return out + "}";
  }
  return to_text({v, false});
}

void dumps(const Json& v, int indent, int depth, std::string& out) {
  const std::string pad =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string comma = indent >= 0 ? "," : ", ";
  if (v.is_object()) {
    if (v.empty()) {
      out += "{}";
      return;
    }
    out += "{";
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      out += (first ? "" : comma) + pad + Json(k).dump(-1, ' ', false) + ": ";
      dumps(e, indent, depth + 1, out);
      first = false;
    }
    out += close + "}";
  } else if (v.is_array()) {
    if (v.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      out += (i ? comma : "") + pad;
      dumps(v[i], indent, depth + 1, out);
    }
    out += close + "]";
  } else if (v.is_number_float()) {
    out += python_float(v.get<double>());
  } else {
    out += v.dump(-1, ' ', false);
  }
}

class Renderer {
 public:
  Renderer(const std::string& origin, const Json& context,
           std::vector<std::pair<size_t, size_t>>* generation)
      : origin_(origin), generation_(generation) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items()) scopes_.back()[k] = v;
  }

  void run(const Body& body) {
    if (exec(body) != Flow::kNormal) fail(0, "break or continue outside a loop");
  }
  std::string& output() { return out_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw UserError("chat template: " + origin_ + (line > 0 ? ":" + std::to_string(line) : "") +
                    ": " + what);
  }

  // The sandbox's size budget for the output and for every string value built.
  void check_size(size_t bytes, int line) const {
    if (bytes > max_text_bytes()) {
      fail(line, "text of " + std::to_string(bytes) + " bytes: more than the template sandbox's " +
                     std::to_string(max_text_bytes() >> 20) + " MiB" +
                     raise_hint("template.text_mib"));
    }
  }
  // The sandbox's budget for the lists and dicts built (max_built_items(), max_built_bytes(), their
  // nesting within max_nesting()): `v` was just built. Walking it costs what copying it did.
  void charge_built(const Json& v, int line) {
    if (measure(v, 0) > max_nesting()) {
      fail(line, "lists or dicts nested more than " + std::to_string(max_nesting()) +
                     " deep: the template sandbox's limit" + raise_hint("template.nesting"));
    }
    if (built_items_ > max_built_items() || built_bytes_ > max_built_bytes()) {
      fail(line, "more than the template sandbox's " + std::to_string(max_built_items()) +
                     " items or " + std::to_string(max_built_bytes() >> 20) +
                     " MiB of strings in the lists and dicts built in one rendering" +
                     raise_hint(built_items_ > max_built_items() ? "template.built_items"
                                                                 : "template.built_mib"));
    }
  }
  // The nesting of `v` (at `depth`), its items and string bytes added to the budget's counts;
  // stops early past either limit.
  int measure(const Json& v, int depth) {
    if (v.is_string()) built_bytes_ += v.get_ref<const std::string&>().size();
    if (!v.is_structured() || depth > max_nesting() || built_items_ > max_built_items())
      return depth;
    int deepest = depth + 1;
    for (const auto& x : v) {
      ++built_items_;
      deepest = std::max(deepest, measure(x, depth + 1));
    }
    return deepest;
  }
  // The output budget counts the text of the callers of the macros (and set blocks) rendering
  // now, held while they render.
  void emit(const std::string& text, int line) {
    check_size(suspended_bytes_ + out_.size() + text.size(), line);
    out_ += text;
  }

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto hit = s->find(name);
      if (hit != s->end())
        return is_unbound(hit->second) ? Value::undef() : Value{hit->second, false};
    }
    return Value::undef();
  }
  Json* find_variable(const std::string& name) {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto hit = s->find(name);
      if (hit != s->end()) return &hit->second;
    }
    return nullptr;
  }

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  // The sandbox's limit on the renderer's recursion (max_render_depth()).
  [[noreturn]] void too_deep(int line) const {
    fail(line, "rendering nested more than " + std::to_string(max_render_depth()) +
                   " levels deep (the template sandbox's limit)" +
                   raise_hint("template.render_depth"));
  }

  Flow exec(const Node& n) {
    NestingGuard guard(
        render_depth_, [&] { too_deep(n.line); }, max_render_depth());
    return exec_node(n);
  }

  Flow exec_node(const Node& n) {
    switch (n.kind) {
      case Node::kText:
        emit(n.text, n.line);
        return Flow::kNormal;
      case Node::kOutput:
        emit(to_text(eval(*n.expr, n.line)), n.line);
        return Flow::kNormal;
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond, n.line))) return exec(body);
        }
        return exec(n.else_body);
      case Node::kFor:
        return exec_for(n);
      case Node::kSet: {
        Value v = eval(*n.expr, n.line);
        assign(n, std::move(v.v));
        return Flow::kNormal;
      }
      case Node::kSetBlock: {
        Flow f = Flow::kNormal;
        std::string captured = capture([&] { f = exec(n.body); });
        assign(n, Json(std::move(captured)));
        return f;
      }
      case Node::kMacro:
        define_macro(n);
        return Flow::kNormal;
      case Node::kGeneration: {
        const size_t begin = out_.size();
        const Flow f = exec(n.body);
        if (generation_ != nullptr) generation_->emplace_back(begin, out_.size());
        return f;
      }
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // What `body()` writes, instead of writing it to the output.
  template <typename Body>
  std::string capture(Body&& body) {
    std::string saved = std::move(out_);
    out_.clear();
    suspended_bytes_ += saved.size();
    body();
    suspended_bytes_ -= saved.size();
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  // {% macro %}: binds its name, here, to the macro and the scopes it sees (those open here).
  void define_macro(const Node& n) {
    const Macro m{&n, scopes_.size()};
    size_t i = 0;
    while (i < macros_.size() && (macros_[i].node != m.node || macros_[i].depth != m.depth)) ++i;
    if (i == macros_.size()) macros_.push_back(m);
    scopes_.back()[n.text] = Json::binary(std::vector<uint8_t>(n.text.begin(), n.text.end()), i);
  }

  // A call of a macro: the arguments bound to its parameters (positional ones, then keywords,
  // then the defaults, evaluated in order in the macro's scope; a parameter without any is
  // undefined), its body rendered seeing the variables of its definition's scopes (not the
  // caller's locals; sets stay local, namespaces are shared), and the text it wrote returned.
  Value call_macro(const Json& callee, std::vector<Value> a, const Expr& e, int line) {
    const Macro m = macros_.at(static_cast<size_t>(callee.get_binary().subtype()));
    const Node& def = *m.node;
    std::vector<std::optional<Value>> bound(def.targets.size());
    if (a.size() > bound.size()) {
      fail(line, "macro '" + def.text + "' takes not more than " + std::to_string(bound.size()) +
                     " argument(s)");
    }
    for (size_t i = 0; i < a.size(); ++i) bound[i] = std::move(a[i]);
    for (const auto& [k, x] : e.kwargs) {
      const auto at = std::find(def.targets.begin(), def.targets.end(), k);
      const auto i = static_cast<size_t>(at - def.targets.begin());
      if (at == def.targets.end() || bound[i]) {
        fail(line, "macro '" + def.text + "' takes no keyword argument '" + k + "'");
      }
      bound[i] = eval(*x, line);
    }
    if (++macro_calls_ > max_macro_calls()) {
      fail(line, "more than " + std::to_string(max_macro_calls()) +
                     " macro calls in one rendering (the template sandbox's limit)" +
                     raise_hint("template.macro_calls"));
    }
    if (++macro_depth_ > max_nesting()) {
      fail(line, "macro calls nested more than " + std::to_string(max_nesting()) +
                     " levels deep (the template sandbox's limit)" +
                     raise_hint("template.nesting"));
    }
    // The caller's scopes above the definition's are hidden while the macro renders.
    const size_t keep = std::min(m.depth, scopes_.size());
    std::vector<std::map<std::string, Json>> hidden(
        std::make_move_iterator(scopes_.begin() + static_cast<std::ptrdiff_t>(keep)),
        std::make_move_iterator(scopes_.end()));
    scopes_.resize(keep);
    scopes_.emplace_back();
    for (size_t i = 0; i < bound.size(); ++i) {
      if (!bound[i] && def.defaults[i]) bound[i] = eval(*def.defaults[i], def.line);
      const bool unbound = !bound[i] || bound[i]->undefined;
      scopes_.back()[def.targets[i]] =
          unbound ? Json::binary(std::vector<uint8_t>()) : std::move(bound[i]->v);
    }
    Flow f = Flow::kNormal;
    std::string text = capture([&] { f = exec(def.body); });
    if (f != Flow::kNormal) fail(def.line, "break or continue outside a loop");
    scopes_.resize(keep);
    for (auto& s : hidden) scopes_.push_back(std::move(s));
    --macro_depth_;
    return {Json(std::move(text)), false};
  }

  void assign(const Node& n, Json v) {
    if (n.attribute.empty()) {
      scopes_.back()[n.text] = std::move(v);
      return;
    }
    Json* ns = find_variable(n.text);
    if (ns == nullptr || !ns->is_object()) fail(n.line, n.text + " is not a namespace");
    (*ns)[n.attribute] = std::move(v);
  }

  Flow exec_for(const Node& n) {
    Value seq = eval(*n.expr, n.line);
    std::vector<Json> items;
    if (seq.v.is_array()) {
      items.assign(seq.v.begin(), seq.v.end());
    } else if (seq.v.is_object()) {
      for (const auto& [k, v] : seq.v.items()) items.emplace_back(k);
    } else if (seq.v.is_string()) {
      for (uint32_t c : code_points(seq.v.get<std::string>()))
        items.emplace_back(from_code_points({c}));
    } else if (!seq.undefined && !seq.v.is_null()) {
      fail(n.line, "a for loop over something that is not a list, mapping or string");
    }
    if (n.loop_filter) {  // "for x in xs if cond": the loop sees only the kept items
      std::vector<Json> kept;
      for (Json& item : items) {
        scopes_.emplace_back();
        bind(n, item);
        if (truthy(eval(*n.loop_filter, n.line))) kept.push_back(std::move(item));
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++iterations_ > max_loop_iterations()) {
        fail(n.line, "more than " + std::to_string(max_loop_iterations()) +
                         " loop iterations in one rendering (the template sandbox's limit)" +
                         raise_hint("template.loop_iterations"));
      }
      scopes_.emplace_back();
      bind(n, items[static_cast<size_t>(i)]);
      Json loop = Json::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = len - i;
      loop["revindex0"] = len - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == len - 1;
      loop["length"] = len;
      if (i > 0) loop["previtem"] = items[static_cast<size_t>(i - 1)];
      if (i + 1 < len) loop["nextitem"] = items[static_cast<size_t>(i + 1)];
      scopes_.back()["loop"] = std::move(loop);
      const Flow f = exec(n.body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void bind(const Node& n, const Json& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.targets.size()) {
      fail(n.line, "cannot unpack a loop item into " + std::to_string(n.targets.size()) + " names");
    }
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = item[k];
  }

  // ---- expressions ----
  Value eval(const Expr& e, int line) {
    NestingGuard guard(
        render_depth_, [&] { too_deep(line); }, max_render_depth());
    return eval_node(e, line);
  }

  Value eval_node(const Expr& e, int line) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.name == "undefined" ? Value::undef() : Value{e.literal, false};
      case Expr::kName:
        return lookup(e.name);
      case Expr::kList: {
        Json a = Json::array();
        for (const auto& x : e.args) a.push_back(eval(*x, line).v);
        charge_built(a, line);
        return {a, false};
      }
      case Expr::kDict: {
        Json o = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          o[to_text(eval(*e.args[i], line))] = eval(*e.args[i + 1], line).v;
        }
        charge_built(o, line);
        return {o, false};
      }
      case Expr::kAttr:
        return attribute(eval(*e.args[0], line), e.name);
      case Expr::kIndex:
        return index(eval(*e.args[0], line), eval(*e.args[1], line), line);
      case Expr::kSlice:
        return slice(e, line);
      case Expr::kCall:
        return call(e, line);
      case Expr::kFilter:
        return filter(e, line);
      case Expr::kTest: {
        const bool r = test(e, line);
        return {Json(e.negated ? !r : r), false};
      }
      case Expr::kNot:
        return {Json(!truthy(eval(*e.args[0], line))), false};
      case Expr::kNeg: {
        const Value v = eval(*e.args[0], line);
        if (v.v.is_number_integer()) {
          const int64_t i = v.v.get<int64_t>();
          if (i == std::numeric_limits<int64_t>::min()) fail(line, "integer beyond 64 bits");
          return {Json(-i), false};
        }
        if (v.v.is_number()) return {Json(-v.v.get<double>()), false};
        fail(line, "unary minus of a non-number");
      }
      case Expr::kBinary:
        return binary(e, line);
      case Expr::kTernary:
        return truthy(eval(*e.args[0], line)) ? eval(*e.args[1], line) : eval(*e.args[2], line);
    }
    return Value::undef();
  }

  static Value attribute(const Value& obj, const std::string& name) {
    if (obj.v.is_object()) {
      auto hit = obj.v.find(name);
      if (hit != obj.v.end()) return {*hit, false};
    }
    return Value::undef();
  }

  Value index(const Value& obj, const Value& key, int line) {
    if (obj.v.is_object()) {
      if (!key.v.is_string()) return Value::undef();
      return attribute(obj, key.v.get<std::string>());
    }
    if ((obj.v.is_array() || obj.v.is_string()) && key.v.is_number_integer()) {
      int64_t i = key.v.get<int64_t>();
      if (obj.v.is_string()) {
        const auto cps = code_points(obj.v.get<std::string>());
        const auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) fail(line, "string index out of range");
        return {Json(from_code_points({cps[static_cast<size_t>(i)]})), false};
      }
      const auto n = static_cast<int64_t>(obj.v.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undef();
      return {obj.v[static_cast<size_t>(i)], false};
    }
    return Value::undef();
  }

  Value slice(const Expr& e, int line) {
    const Value obj = eval(*e.args[0], line);
    auto bound = [&](int k) -> std::optional<int64_t> {
      if (!e.args[static_cast<size_t>(k)]) return std::nullopt;
      const Value v = eval(*e.args[static_cast<size_t>(k)], line);
      if (v.v.is_null() || v.undefined) return std::nullopt;
      if (!v.v.is_number_integer()) fail(line, "a slice bound that is not an integer");
      return v.v.get<int64_t>();
    };
    const auto start = bound(1), stop = bound(2), step_given = bound(3);
    const int64_t step = step_given.value_or(1);
    if (step == 0) fail(line, "slice step cannot be zero");
    std::vector<Json> items;
    const bool is_string = obj.v.is_string();
    if (is_string) {
      for (uint32_t c : code_points(obj.v.get<std::string>())) items.emplace_back(c);
    } else if (obj.v.is_array()) {
      items.assign(obj.v.begin(), obj.v.end());
    } else {
      fail(line, "slicing something that is not a list or string");
    }
    // Python's slice.indices().
    const auto n = static_cast<int64_t>(items.size());
    auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
      if (!b) return dflt;
      int64_t v = *b < 0 ? *b + n : *b;
      return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t from = clamp(start, step > 0 ? 0 : n - 1), to = clamp(stop, step > 0 ? n : -1);
    Json out = Json::array();
    std::vector<uint32_t> cps;
    for (int64_t i = from; step > 0 ? i < to : i > to; i += step) {
      if (is_string) {
        cps.push_back(items[static_cast<size_t>(i)].get<uint32_t>());
      } else {
        out.push_back(items[static_cast<size_t>(i)]);
      }
    }
    return is_string ? Value{Json(from_code_points(cps)), false} : Value{out, false};
  }

  std::vector<Value> arguments(const Expr& e, int line, size_t first) {
    std::vector<Value> a;
    for (size_t i = first; i < e.args.size(); ++i) a.push_back(eval(*e.args[i], line));
    return a;
  }
  Value kwarg(const Expr& e, const std::string& key, int line) {
    for (const auto& [k, x] : e.kwargs) {
      if (k == key) return eval(*x, line);
    }
    return Value::undef();
  }

  Value call(const Expr& e, int line) {
    const Expr& callee = *e.args[0];
    std::vector<Value> a = arguments(e, line, 1);
    if (callee.kind == Expr::kName) {
      const Value f = lookup(callee.name);
      if (is_macro(f.v)) return call_macro(f.v, std::move(a), e, line);
      if (callee.name == "raise_exception") {
        fail(line, "raise_exception: " + (a.empty() ? std::string() : to_text(a[0])));
      }
      if (callee.name == "namespace" || callee.name == "dict") {
        Json o = Json::object();
        for (const auto& [k, x] : e.kwargs) o[k] = eval(*x, line).v;
        charge_built(o, line);
        return {o, false};
      }
      if (callee.name == "range") {
        // Integers (Python's bools among them), as Python's range() takes.
        auto integer = [&](const Value& v) -> int64_t {
          if (v.v.is_boolean()) return v.v.get<bool>() ? 1 : 0;
          if (!v.v.is_number_integer()) {
            fail(line, std::string("range() of ") + (v.undefined ? "undefined" : v.v.type_name()) +
                           ": expected integers");
          }
          return v.v.get<int64_t>();
        };
        int64_t lo = 0, hi = 0, step = 1;
        if (a.size() == 1) {
          hi = integer(a[0]);
        } else if (a.size() >= 2) {
          lo = integer(a[0]), hi = integer(a[1]);
          if (a.size() > 2) step = integer(a[2]);
        }
        if (step == 0) fail(line, "range() step cannot be zero");
        const double items = std::ceil((static_cast<double>(hi) - static_cast<double>(lo)) /
                                       static_cast<double>(step));
        if (items > static_cast<double>(max_range())) {
          fail(line, "range() of " + std::to_string(static_cast<int64_t>(items)) +
                         " items: more than the template sandbox's " + std::to_string(max_range()) +
                         " (Jinja2's MAX_RANGE)" + raise_hint("template.range_items"));
        }
        Json out = Json::array();
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) out.push_back(i);
        return {out, false};
      }
      if (callee.name == "strftime_now") {
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[128];
        std::strftime(buf, sizeof buf, a.empty() ? "%Y-%m-%d" : to_text(a[0]).c_str(), &tm);
        return {Json(std::string(buf)), false};
      }
      fail(line, "unknown function " + callee.name + "()");
    }
    if (callee.kind != Expr::kAttr) fail(line, "a call of something that is not a function");
    return method(eval(*callee.args[0], line), callee.name, a, e, line);
  }

  // Methods of strings and of mappings: the name called, the receiver, the arguments.
  using StringMethod = Value (*)(const std::string& name, const std::string& s,
                                 const std::vector<Value>& a);
  using ObjectMethod = Value (*)(const std::string& name, const Value& obj,
                                 const std::vector<Value>& a);

  Value method(const Value& obj, const std::string& name, const std::vector<Value>& a,
               const Expr& e, int line) {
    static const std::unordered_map<std::string_view, StringMethod> string_methods = {
        {"startswith", &Renderer::string_affix}, {"endswith", &Renderer::string_affix},
        {"strip", &Renderer::string_strip},      {"lstrip", &Renderer::string_strip},
        {"rstrip", &Renderer::string_strip},     {"split", &Renderer::string_split},
        {"upper", &Renderer::string_case},       {"lower", &Renderer::string_case},
        {"replace", &Renderer::string_replace},  {"title", &Renderer::string_title},
        {"capitalize", &Renderer::string_title}, {"format", &Renderer::string_format},
    };
    static const std::unordered_map<std::string_view, ObjectMethod> object_methods = {
        {"items", &Renderer::object_items},
        {"keys", &Renderer::object_keys_or_values},
        {"values", &Renderer::object_keys_or_values},
        {"get", &Renderer::object_get},
    };
    const Json& v = obj.v;
    if (v.is_string()) {
      const auto hit = string_methods.find(name);
      if (hit != string_methods.end()) return hit->second(name, v.get<std::string>(), a);
    }
    if (v.is_object()) {
      const auto hit = object_methods.find(name);
      if (hit != object_methods.end()) return hit->second(name, obj, a);
    }
    (void)e;
    fail(line, "unsupported method ." + name + "() on " +
                   (obj.undefined ? "an undefined value" : std::string(v.type_name())));
  }

  // Argument i as text; empty when absent or None.
  static std::string text_arg(const std::vector<Value>& a, size_t i) {
    return i < a.size() && !a[i].v.is_null() ? to_text(a[i]) : std::string();
  }
  // The first argument as text; none when absent or None.
  static std::optional<std::string> optional_text_arg(const std::vector<Value>& a) {
    return a.empty() || a[0].v.is_null() ? std::optional<std::string>() : text_arg(a, 0);
  }

  // startswith / endswith, with one affix or a list of them.
  static Value string_affix(const std::string& name, const std::string& s,
                            const std::vector<Value>& a) {
    std::vector<std::string> options;
    if (!a.empty() && a[0].v.is_array()) {
      for (const auto& o : a[0].v) options.push_back(o.get<std::string>());
    } else {
      options.push_back(text_arg(a, 0));
    }
    for (const auto& o : options) {
      const bool hit = name == "startswith" ? s.compare(0, o.size(), o) == 0
                                            : s.size() >= o.size() &&
                                                  s.compare(s.size() - o.size(), o.size(), o) == 0;
      if (hit) return {Json(true), false};
    }
    return {Json(false), false};
  }

  static Value string_strip(const std::string& name, const std::string& s,
                            const std::vector<Value>& a) {
    return {Json(strip(s, optional_text_arg(a), name != "rstrip", name != "lstrip")), false};
  }

  static Value string_split(const std::string&, const std::string& s, const std::vector<Value>& a) {
    return {split(s, optional_text_arg(a), a.size() > 1 ? a[1].v.get<int64_t>() : -1), false};
  }

  // upper / lower: ASCII letters only, as before.
  static Value string_case(const std::string& name, const std::string& s,
                           const std::vector<Value>&) {
    std::string out = s;
    for (char& c : out) {
      if (c >= 'a' && c <= 'z' && name == "upper") c = static_cast<char>(c - 32);
      if (c >= 'A' && c <= 'Z' && name == "lower") c = static_cast<char>(c + 32);
    }
    return {Json(out), false};
  }

  static Value string_replace(const std::string&, const std::string& s,
                              const std::vector<Value>& a) {
    const std::string from = text_arg(a, 0), to = text_arg(a, 1);
    if (from.empty()) return {Json(s), false};
    std::string out;
    size_t at = 0;
    for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
      out.append(s, at, hit - at).append(to);
      at = hit + from.size();
    }
    out.append(s, at, std::string::npos);
    return {Json(out), false};
  }

  // title (every word) / capitalize (the first letter only).
  static Value string_title(const std::string& name, const std::string& s,
                            const std::vector<Value>&) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
      if (alpha && start)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      else if (alpha)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      start = name == "title" ? !alpha : false;
    }
    return {Json(out), false};
  }

  // "{}" placeholders filled in order.
  static Value string_format(const std::string&, const std::string& s,
                             const std::vector<Value>& a) {
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s.compare(i, 2, "{}") == 0 && next < a.size()) {
        out += to_text(a[next++]);
        ++i;
      } else {
        out += s[i];
      }
    }
    return {Json(out), false};
  }

  static Value object_items(const std::string&, const Value& obj, const std::vector<Value>&) {
    Json out = Json::array();
    for (const auto& [k, x] : obj.v.items()) out.push_back(Json::array({k, x}));
    return {out, false};
  }

  static Value object_keys_or_values(const std::string& name, const Value& obj,
                                     const std::vector<Value>&) {
    Json out = Json::array();
    for (const auto& [k, x] : obj.v.items()) out.push_back(name == "keys" ? Json(k) : x);
    return {out, false};
  }

  static Value object_get(const std::string&, const Value& obj, const std::vector<Value>& a) {
    const Value hit = a.empty() ? Value::undef() : attribute(obj, to_text(a[0]));
    return hit.undefined ? (a.size() > 1 ? a[1] : Value{Json(), false}) : hit;
  }

  static std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                           bool right) {
    auto strippable = [&](uint32_t c) {
      if (!chars) return utf8::is_white_space(c);
      for (uint32_t k : code_points(*chars)) {
        if (k == c) return true;
      }
      return false;
    };
    std::vector<uint32_t> cps = code_points(s);
    size_t b = 0, e = cps.size();
    while (left && b < e && strippable(cps[b])) ++b;
    while (right && e > b && strippable(cps[e - 1])) --e;
    return from_code_points({cps.begin() + static_cast<std::ptrdiff_t>(b),
                             cps.begin() + static_cast<std::ptrdiff_t>(e)});
  }

  static Json split(const std::string& s, const std::optional<std::string>& sep, int64_t max) {
    Json out = Json::array();
    if (sep && !sep->empty()) {
      size_t at = 0;
      for (size_t hit = s.find(*sep);
           hit != std::string::npos && (max < 0 || static_cast<int64_t>(out.size()) < max);
           hit = s.find(*sep, at)) {
        out.push_back(s.substr(at, hit - at));
        at = hit + sep->size();
      }
      out.push_back(s.substr(at));
      return out;
    }
    std::string word;  // Python's split(): runs of white space, none at the ends
    for (size_t i = 0, n = 0; i < s.size(); i += n) {
      const uint32_t c = utf8::decode(s, i, n);
      if (utf8::is_white_space(c)) {
        if (!word.empty()) out.push_back(word);
        word.clear();
      } else {
        word.append(s, i, n);
      }
    }
    if (!word.empty()) out.push_back(word);
    return out;
  }

  // A filter: its name, the value filtered, the positional arguments, the call, the line.
  using Filter = Value (Renderer::*)(const std::string& f, const Value& x,
                                     const std::vector<Value>& a, const Expr& e, int line);

  Value filter(const Expr& e, int line) {
    static const std::unordered_map<std::string_view, Filter> filters = {
        {"length", &Renderer::filter_length},
        {"count", &Renderer::filter_length},
        {"tojson", &Renderer::filter_tojson},
        {"trim", &Renderer::filter_trim},
        {"upper", &Renderer::filter_as_method},
        {"lower", &Renderer::filter_as_method},
        {"title", &Renderer::filter_as_method},
        {"capitalize", &Renderer::filter_as_method},
        {"items", &Renderer::filter_as_method},
        {"string", &Renderer::filter_string},
        {"safe", &Renderer::filter_safe},
        {"default", &Renderer::filter_default},
        {"d", &Renderer::filter_default},
        {"first", &Renderer::filter_first_or_last},
        {"last", &Renderer::filter_first_or_last},
        {"join", &Renderer::filter_join},
        {"list", &Renderer::filter_list},
        {"reverse", &Renderer::filter_reverse},
        {"int", &Renderer::filter_int},
        {"replace", &Renderer::filter_replace},
        {"selectattr", &Renderer::filter_select_or_reject},
        {"rejectattr", &Renderer::filter_select_or_reject},
        {"map", &Renderer::filter_map},
    };
    const Value x = eval(*e.args[0], line);
    const std::vector<Value> a = arguments(e, line, 1);
    const std::string& f = e.name;
    const auto hit = filters.find(f);
    if (hit == filters.end()) fail(line, "unsupported filter |" + f);
    return (this->*(hit->second))(f, x, a, e, line);
  }

  Value filter_length(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                      int) {
    if (x.v.is_string())
      return {Json(static_cast<int64_t>(code_points(x.v.get<std::string>()).size())), false};
    return {Json(static_cast<int64_t>(x.undefined || x.v.is_null() ? 0 : x.v.size())), false};
  }

  Value filter_tojson(const std::string&, const Value& x, const std::vector<Value>& a,
                      const Expr& e, int line) {
    Value indent = kwarg(e, "indent", line);
    if (indent.undefined && !a.empty()) indent = a[0];
    return {Json(python_json_dumps(
                x.v, indent.undefined || indent.v.is_null() ? -1 : indent.v.get<int>())),
            false};
  }

  Value filter_trim(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                    int) {
    return {Json(strip(to_text(x), std::nullopt, true, true)), false};
  }

  // upper, lower, title, capitalize, items: the method of that name, on text or a mapping.
  Value filter_as_method(const std::string& f, const Value& x, const std::vector<Value>&,
                         const Expr& e, int line) {
    return method(Value{x.v.is_object() ? x.v : Json(to_text(x)), false}, f, {}, e, line);
  }

  Value filter_string(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                      int) {
    return {Json(to_text(x)), false};
  }

  Value filter_safe(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                    int) {
    return x;
  }

  Value filter_default(const std::string&, const Value& x, const std::vector<Value>& a, const Expr&,
                       int) {
    const bool boolean = a.size() > 1 && truthy(a[1]);
    if (x.undefined || (boolean && !truthy(x))) return a.empty() ? Value{Json(""), false} : a[0];
    return x;
  }

  Value filter_first_or_last(const std::string& f, const Value& x, const std::vector<Value>&,
                             const Expr&, int) {
    if (x.v.is_array() && !x.v.empty()) return {f == "first" ? x.v.front() : x.v.back(), false};
    return Value::undef();
  }

  Value filter_join(const std::string&, const Value& x, const std::vector<Value>& a, const Expr&,
                    int) {
    std::string out;
    const std::string sep = a.empty() ? "" : to_text(a[0]);
    if (x.v.is_array()) {
      for (size_t i = 0; i < x.v.size(); ++i) out += (i ? sep : "") + to_text({x.v[i], false});
    }
    return {Json(out), false};
  }

  Value filter_list(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                    int) {
    if (x.v.is_array()) return x;
    Json out = Json::array();
    if (x.v.is_string()) {
      for (uint32_t c : code_points(x.v.get<std::string>())) out.push_back(from_code_points({c}));
    }
    return {out, false};
  }

  Value filter_reverse(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                       int) {
    if (x.v.is_string()) {
      auto cps = code_points(x.v.get<std::string>());
      std::reverse(cps.begin(), cps.end());
      return {Json(from_code_points(cps)), false};
    }
    Json out = x.v;
    if (out.is_array()) std::reverse(out.begin(), out.end());
    return {out, false};
  }

  Value filter_int(const std::string&, const Value& x, const std::vector<Value>&, const Expr&,
                   int line) {
    if (x.v.is_number_integer()) return {x.v, false};
    if (x.v.is_number()) {
      const double d = x.v.get<double>();
      // Python's int() of inf or nan raises; a float past 64 bits has no int here.
      if (!(std::fabs(d) < 9.2e18)) fail(line, "int of " + x.v.dump() + ": beyond 64 bits");
      return {Json(static_cast<int64_t>(d)), false};
    }
    try {
      return {Json(std::stoll(to_text(x))), false};
    } catch (const std::exception&) {
      return {Json(0), false};
    }
  }

  Value filter_replace(const std::string&, const Value& x, const std::vector<Value>& a,
                       const Expr& e, int line) {
    return method({Json(to_text(x)), false}, "replace", a, e, line);
  }

  // selectattr / rejectattr: the attribute a[0] is truthy, or passes the test a[1] (with a[2]).
  Value filter_select_or_reject(const std::string& f, const Value& x, const std::vector<Value>& a,
                                const Expr&, int line) {
    Json out = Json::array();
    if (x.v.is_array() && !a.empty()) {
      for (const auto& item : x.v) {
        const Value attr = attribute({item, false}, to_text(a[0]));
        const bool keep = a.size() > 1 ? attribute_passes(attr, a, f, line) : truthy(attr);
        if (keep == (f == "selectattr")) out.push_back(item);
      }
    }
    return {out, false};
  }

  // The test named by a[1] (defined, undefined, equalto a[2]) on an attribute for filter f.
  bool attribute_passes(const Value& attr, const std::vector<Value>& a, const std::string& f,
                        int line) const {
    const std::string test = to_text(a[1]);
    if (test == "defined") return !attr.undefined;
    if (test == "undefined") return attr.undefined;
    if (test == "equalto" || test == "eq" || test == "==")
      return a.size() > 2 && !attr.undefined && attr.v == a[2].v;
    fail(line, "unsupported test " + test + " in " + f);
  }

  Value filter_map(const std::string&, const Value& x, const std::vector<Value>&, const Expr& e,
                   int line) {
    Json out = Json::array();
    const Value attr = kwarg(e, "attribute", line);
    if (attr.undefined) fail(line, "map filter supports attribute= only");
    if (x.v.is_array()) {
      for (const auto& item : x.v) out.push_back(attribute({item, false}, to_text(attr)).v);
    }
    return {out, false};
  }

  bool test(const Expr& e, int line) {
    const Value x = eval(*e.args[0], line);
    const std::string& t = e.name;
    if (t == "defined") return !x.undefined;
    if (t == "undefined") return x.undefined;
    if (x.undefined && t != "none") return false;
    if (t == "none") return !x.undefined && x.v.is_null();
    if (t == "string") return x.v.is_string();
    if (t == "number") return x.v.is_number();
    if (t == "integer") return x.v.is_number_integer();
    if (t == "float") return x.v.is_number_float();
    if (t == "boolean") return x.v.is_boolean();
    if (t == "true") return x.v.is_boolean() && x.v.get<bool>();
    if (t == "false") return x.v.is_boolean() && !x.v.get<bool>();
    if (t == "mapping") return x.v.is_object();
    if (t == "sequence" || t == "iterable")
      return x.v.is_array() || x.v.is_string() || x.v.is_object();
    if (t == "even" || t == "odd")
      return x.v.is_number_integer() && (x.v.get<int64_t>() % 2 == 0) == (t == "even");
    if (t == "equalto" || t == "eq" || t == "sameas") {
      if (e.args.size() < 2) fail(line, "test " + t + " needs a value");
      return x.v == eval(*e.args[1], line).v;
    }
    fail(line, "unsupported test 'is " + t + "'");
  }

  Value binary(const Expr& e, int line) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0], line);
      return truthy(a) ? eval(*e.args[1], line) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0], line);
      return truthy(a) ? a : eval(*e.args[1], line);
    }
    const Value a = eval(*e.args[0], line), b = eval(*e.args[1], line);
    if (std::optional<Value> r = compare_or_concatenate(op, a, b, line)) return *r;
    if (!a.v.is_number() || !b.v.is_number()) return repeat_string(op, a, b, line);
    return arithmetic(op, a, b, line);
  }

  // ~, == and !=, in and not in, and + on two strings or two lists; none for other operators.
  std::optional<Value> compare_or_concatenate(const std::string& op, const Value& a, const Value& b,
                                              int line) {
    if (op == "~") {
      std::string joined = to_text(a) + to_text(b);
      check_size(joined.size(), line);
      return Value{Json(std::move(joined)), false};
    }
    if (op == "==" || op == "!=") {
      const bool eq = a.undefined || b.undefined ? (a.undefined && b.undefined) : a.v == b.v;
      return Value{Json(op == "==" ? eq : !eq), false};
    }
    if (op == "in" || op == "not in") {
      const bool found = contains(b, a);
      return Value{Json(op == "in" ? found : !found), false};
    }
    if (op == "+" && a.v.is_string() && b.v.is_string()) {
      check_size(
          a.v.get_ref<const std::string&>().size() + b.v.get_ref<const std::string&>().size(),
          line);
      return Value{Json(a.v.get<std::string>() + b.v.get<std::string>()), false};
    }
    if (op == "+" && a.v.is_array() && b.v.is_array()) {
      Json out = a.v;
      for (const auto& x : b.v) out.push_back(x);
      charge_built(out, line);
      return Value{out, false};
    }
    return std::nullopt;
  }

  // `needle in haystack`: a substring, a list item or a mapping's key.
  static bool contains(const Value& haystack, const Value& needle) {
    const Json& b = haystack.v;
    if (b.is_string()) return b.get<std::string>().find(to_text(needle)) != std::string::npos;
    if (b.is_array()) return std::find(b.begin(), b.end(), needle.v) != b.end();
    if (b.is_object()) return needle.v.is_string() && b.contains(needle.v.get<std::string>());
    return false;
  }

  // An operator with an operand that is not a number: only string * integer is defined.
  Value repeat_string(const std::string& op, const Value& a, const Value& b, int line) const {
    if (op == "*" && a.v.is_string() && b.v.is_number_integer()) {
      const double bytes = static_cast<double>(a.v.get_ref<const std::string&>().size()) *
                           static_cast<double>(std::max<int64_t>(0, b.v.get<int64_t>()));
      check_size(bytes > static_cast<double>(max_text_bytes()) ? max_text_bytes() + 1
                                                               : static_cast<size_t>(bytes),
                 line);
      std::string out;
      for (int64_t i = 0; i < b.v.get<int64_t>(); ++i) out += a.v.get<std::string>();
      return {Json(out), false};
    }
    fail(line, "operator " + op + " on " + (a.undefined ? "undefined" : a.v.type_name()) + " and " +
                   (b.undefined ? "undefined" : b.v.type_name()));
  }

  // Comparisons and arithmetic on two numbers: integer arithmetic when both are integers.
  Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) const {
    const double x = a.v.get<double>(), y = b.v.get<double>();
    if (op == "<") return {Json(x < y), false};
    if (op == ">") return {Json(x > y), false};
    if (op == "<=") return {Json(x <= y), false};
    if (op == ">=") return {Json(x >= y), false};
    if (a.v.is_number_integer() && b.v.is_number_integer()) {
      if (std::optional<Value> r =
              integer_arithmetic(op, a.v.get<int64_t>(), b.v.get<int64_t>(), line)) {
        return *r;
      }
    }
    if (op == "+") return {Json(x + y), false};
    if (op == "-") return {Json(x - y), false};
    if (op == "*") return {Json(x * y), false};
    if (y == 0) fail(line, "division by zero");
    if (op == "/") return {Json(x / y), false};
    if (op == "//") return {Json(std::floor(x / y)), false};
    if (op == "%") return {Json(x - y * std::floor(x / y)), false};
    fail(line, "unsupported operator " + op);
  }

  // + - * // % on two integers (Python's floor division and modulo); none for other operators.
  std::optional<Value> integer_arithmetic(const std::string& op, int64_t i, int64_t j,
                                          int line) const {
    // Python's ints are unbounded; here a result past 64 bits is an error.
    int64_t r = 0;
    if ((op == "+" && __builtin_add_overflow(i, j, &r)) ||
        (op == "-" && __builtin_sub_overflow(i, j, &r)) ||
        (op == "*" && __builtin_mul_overflow(i, j, &r)) ||
        ((op == "//" || op == "%") && i == std::numeric_limits<int64_t>::min() && j == -1)) {
      fail(line, "integer " + op + " beyond 64 bits");
    }
    if (op == "+" || op == "-" || op == "*") return Value{Json(r), false};
    if ((op == "//" || op == "%") && j == 0) fail(line, "division by zero");
    if (op == "//") return Value{Json(i / j - (i % j != 0 && (i % j < 0) != (j < 0))), false};
    if (op == "%")
      return Value{Json(i % j != 0 && (i % j < 0) != (j < 0) ? i % j + j : i % j), false};
    return std::nullopt;
  }

  const std::string& origin_;
  std::vector<std::pair<size_t, size_t>>* generation_;
  std::vector<std::map<std::string, Json>> scopes_;
  std::string out_;
  int64_t iterations_ = 0;  // for-loop iterations so far in this rendering
  struct Macro {
    const Node* node;  // its {% macro %}
    size_t depth;      // the scopes open where it was defined: those it sees
  };
  std::vector<Macro> macros_;   // those defined so far (a binary value's subtype indexes them)
  int macro_depth_ = 0;         // macro calls within macro calls now
  int render_depth_ = 0;        // eval and exec calls within each other now (max_render_depth())
  int64_t macro_calls_ = 0;     // macro calls so far in this rendering
  int64_t built_items_ = 0;     // items of the lists and dicts built so far (max_built_items())
  size_t built_bytes_ = 0;      // their strings' bytes (max_built_bytes())
  size_t suspended_bytes_ = 0;  // the output held by the macro calls and set blocks rendering
};

}  // namespace

std::string python_json_dumps(const Json& value, int indent) {
  std::string out;
  dumps(value, indent, 0, out);
  return out;
}

ChatTemplate::ChatTemplate(const std::string& source, std::string origin)
    : origin_(std::move(origin)) {
  // transformers reads templates as UTF-8 text and fails on anything else.
  if (const size_t bad = first_invalid_utf8(source); bad != std::string::npos) {
    throw UserError("chat template: " + origin_ + ": not UTF-8 (byte " + std::to_string(bad) + ")");
  }
  try {
    body_ = TemplateParser(split_template(source)).parse_all();
  } catch (const SyntaxError& e) {
    throw UserError("chat template: " + origin_ + ":" + std::to_string(e.line) + ": " + e.what);
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const Json& context,
                                 std::vector<std::pair<size_t, size_t>>* generation) const {
  Renderer r(origin_, context, generation);
  try {
    r.run(body_);
  } catch (const Json::exception& e) {
    // A value of a type the operation does not take (Jinja2: a TypeError) that no check above
    // names better: still the template's error.
    throw UserError("chat template: " + origin_ + ": " + e.what());
  }
  return std::move(r.output());
}

}  // namespace moe::data
