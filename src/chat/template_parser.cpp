#include <algorithm>

#include "template_budget.h"
#include "template_parser.h"

namespace moe::chat {

namespace {

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
                        too_deep_message("blocks", max_nesting(), "template.nesting")};
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

}  // namespace

Body parse_template(std::vector<Piece> pieces) {
  return TemplateParser(std::move(pieces)).parse_all();
}

}  // namespace moe::chat
