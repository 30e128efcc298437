#include "template_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string_view>

#include "moe/tokenizers/utf8.h"
#include "template_ast.h"

namespace moe::chat {

namespace utf8 = tokenizers::utf8;

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
namespace {

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
    return;
  }
  if (!block || modifier == '+') return;
  // lstrip_blocks: the blanks between the start of the tag's source line and the tag go, when
  // nothing else (another tag) stands on the line before it. Only the text (src[i, open)) is
  // searched for the line's start: a line that starts before it holds the tag before it (a
  // search back to the start of a long line for every tag was quadratic).
  const size_t nl = std::string_view(src).substr(i, open - i).rfind('\n');
  size_t line_start = i;
  if (nl != std::string_view::npos) {
    line_start = i + nl + 1;
  } else if (i > 0 && src[i - 1] != '\n') {
    return;
  }
  const size_t blanks = open - line_start;
  if (src.find_first_not_of(" \t", line_start) >= open) {
    text.erase(text.size() - std::min(blanks, text.size()));
  }
}

}  // namespace

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

std::optional<Tag> next_tag(const std::string& src, size_t i) {
  const size_t open = find_tag_open(src, i);
  if (open == std::string::npos) return std::nullopt;
  Tag t{open, src[open + 1], open + 2 < src.size() ? src[open + 2] : '\0', 0, 0, 0, false};
  const char* close = t.kind == '{' ? "}}" : t.kind == '%' ? "%}" : "#}";
  t.end = src.find(close, open + 2);
  if (t.end == std::string::npos) return t;
  t.body_from = open + 2 + ((t.modifier == '-' || t.modifier == '+') ? 1 : 0);
  t.body_to = t.end;
  t.strip_next = t.end > t.body_from && src[t.end - 1] == '-';
  if (t.strip_next) --t.body_to;
  return t;
}

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
    const std::optional<Tag> tag = next_tag(src, i);
    std::string text = src.substr(i, tag ? tag->open - i : std::string::npos);
    trim_text_after_tag(text, strip_next, trim_next);
    const int text_line = line;
    if (!tag) {
      out.push_back({Piece::kText, text, text_line});
      break;
    }
    const bool block = tag->kind == '%' || tag->kind == '#';
    trim_text_before_tag(text, src, i, tag->open, block, tag->modifier);
    out.push_back({Piece::kText, text, text_line});
    count_lines(i, tag->open);
    if (tag->end == std::string::npos) throw SyntaxError{line, "an unclosed tag"};
    strip_next = tag->strip_next;
    trim_next = block;
    const std::string body = src.substr(tag->body_from, tag->body_to - tag->body_from);
    if (tag->kind != '#') {
      out.push_back({tag->kind == '{' ? Piece::kExpr : Piece::kStmt, body, line});
    }
    count_lines(tag->open, tag->end);
    i = tag->end + 2;
    if (i > src.size()) break;
  }
  return out;
}

}  // namespace moe::chat
