// The chat-template engine's lexing: the source cut into text and tags (with Jinja's whitespace
// control and transformers' trim_blocks and lstrip_blocks), and an expression's tokens.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace moe::chat {

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
};

bool is_name_start(char c);
bool is_name_char(char c);

// The tokens of an expression (a tag's body) on source line `line`, then kEnd; SyntaxError on a
// bad string, escape or character.
std::vector<Token> lex(const std::string& s, int line);

// A tag of the source: {{ }}, {% %} or {# #}.
struct Tag {
  size_t open;       // its '{'
  char kind;         // '{', '%' or '#'
  char modifier;     // the character after the opening ('-' or '+': whitespace control), or 0
  size_t end;        // its closing "}}", "%}" or "#}"; npos when unclosed
  size_t body_from;  // its body, without the whitespace control (when closed)
  size_t body_to;
  bool strip_next;  // "-%}": the blanks after it go
};

// The first tag that opens at or after src[i], or none.
std::optional<Tag> next_tag(const std::string& src, size_t i);

struct Piece {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string body;
  int line;
};

// The template cut into text, {{ }} and {% %}, with Jinja's whitespace control and the
// trim_blocks and lstrip_blocks options transformers sets. SyntaxError on an unclosed tag.
std::vector<Piece> split_template(const std::string& src);

}  // namespace moe::chat
