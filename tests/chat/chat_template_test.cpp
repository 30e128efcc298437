// The chat-template evaluator on the Jinja features the families' templates use (each expected
// string is what Python's jinja2, with transformers' trim_blocks and lstrip_blocks, renders), its
// errors, and Python-style tojson. tests/chat/sft_data_test.py checks whole templates against
// transformers.
#include <gtest/gtest.h>

#include "moe/chat/chat_template.h"
#include "moe/util/errors.h"

namespace moe::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& src, const Json& ctx = Json::object()) {
  return ChatTemplate(src, "test.jinja").render(ctx);
}

TEST(ChatTemplate, WhitespaceControlTrimAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one;
  // "-" strips all white space on its side.
  EXPECT_EQ(render("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x\n    {% if true %}y{% endif %}"), "x\ny");
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render("{%- for i in [1, 2] %}\n    {{- i }}\n{%- endfor %}"), "12");
  EXPECT_EQ(render("{# a comment #}\nz"), "z");
}

TEST(ChatTemplate, LoopsNamespacesAndScopes) {
  const Json ctx = {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}},
                                              {{"role", "assistant"}, {"content", "yo"}}})}};
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index0 }}{{ m.role[0] }}{% if not loop.last "
                   "%},{% endif %}{% endfor %}",
                   ctx),
            "0u,1a");
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ m['content'] }}{% endfor %}", ctx), "yohi");
  // set inside a loop does not leak; a namespace's attribute does.
  EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in [5] %}{% set x = i "
                   "%}{% set ns.y = i %}{% endfor %}{{ x }}/{{ ns.y }}"),
            "1/5");
  EXPECT_EQ(
      render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
      "012");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(
      render("{% for m in messages if m.role == 'assistant' %}{{ m.content }}{% endfor %}", ctx),
      "yo");
}

TEST(ChatTemplate, ExpressionsFiltersAndTests) {
  EXPECT_EQ(render("{{ '<think>\nr\n</think>\n\nans'.split('</think>')[-1].lstrip('\n') }}"),
            "ans");
  EXPECT_EQ(render("{{ '  x y  '.strip() }}|{{ 'abc'.startswith('ab') }}|{{ 'é漢'|length }}"),
            "x y|True|2");
  EXPECT_EQ(render("{{ x is defined }}{{ x is not defined }}{{ none is none }}{{ 'a' is string }}"),
            "FalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 'a' ~ 1 }} {{ 2.0 }}"),
            "7 3 1 a1 2.0");
  EXPECT_EQ(render("{{ 'yes' if 'b' in 'abc' else 'no' }}{{ 'x' if false }}"), "yes");
  EXPECT_EQ(render("{{ [1, 2, 3]|join(', ') }} {{ none }} {{ true }} {{ [1]|first }}"),
            "1, 2, 3 None True 1");
  EXPECT_EQ(render("{{ d.get('k', 'dflt') }}{{ d.missing|default('z') }}", {{"d", Json::object()}}),
            "dfltz");
}

TEST(ChatTemplate, TojsonIsPythonsJsonDumps) {
  const Json tool =
      Json::parse(R"({"name": "f", "args": {"x": [1, 2.5, "é\n"], "b": true, "n": null}})");
  EXPECT_EQ(python_json_dumps(tool),
            "{\"name\": \"f\", \"args\": {\"x\": [1, 2.5, \"é\\n\"], \"b\": true, \"n\": null}}");
  EXPECT_EQ(python_json_dumps(Json::parse(R"({"a": [1], "e": {}})"), 2),
            "{\n  \"a\": [\n    1\n  ],\n  \"e\": {}\n}");
  EXPECT_EQ(render("{{ t | tojson }}", {{"t", Json::parse(R"({"z": 1, "a": 2.0})")}}),
            "{\"z\": 1, \"a\": 2.0}");  // insertion order kept, as Python dicts
}

TEST(ChatTemplate, PrintedValuesAreReprAsPython) {
  // A dict or list printed is its Python repr (GLM-4.5's template prints a tool result without
  // "output" so): strings quoted as repr() quotes them, with \t \r \n and the code points
  // str.isprintable() refuses (controls, format characters, separators but the space, private
  // use) escaped; printable non-ASCII kept. -0.0 keeps its sign, printed and in tojson.
  const Json d = Json::parse(
      R"({"a": "it's", "b": "say \"x\"", "c": "both ' and \"", "t": "tab\there\r\n\\",
          "ctl": "\u0007\u007f\u0085", "sp": "a\u00a0b\u3000c", "fmt": "\u200b\ufeff\u00ad",
          "ls": "\u2028", "pua": "\ue000\udb80\udc00", "ok": "日本 é 😀 ß"})");
  EXPECT_EQ(render("{{ d }}", {{"d", d}}),
            R"({'a': "it's", 'b': 'say "x"', 'c': 'both \' and "', 't': 'tab\there\r\n\\', )"
            R"('ctl': '\x07\x7f\x85', 'sp': 'a\xa0b\u3000c', 'fmt': '\u200b\ufeff\xad', )"
            R"('ls': '\u2028', 'pua': '\ue000\U000f0000', 'ok': '日本 é 😀 ß'})");
  EXPECT_EQ(render("{{ x }} {{ [x, 1.5] | tojson }} {{ {'k': x} }}", {{"x", -0.0}}),
            "-0.0 [-0.0, 1.5] {'k': -0.0}");
}

TEST(ChatTemplate, GenerationBlocksAreRecorded) {
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string out = ChatTemplate("a{% generation %}bc{% endgeneration %}d", "t.jinja")
                              .render(Json::object(), &spans);
  EXPECT_EQ(out, "abcd");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], std::make_pair(size_t{1}, size_t{3}));
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  try {
    ChatTemplate("ok\n{% include 'other.jinja' %}", "t.jinja");
    FAIL() << "include should be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("include"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate("{% if x %}never closed", "t.jinja"), UserError);
  EXPECT_THROW(ChatTemplate("{{ 'unterminated }}", "t.jinja"), UserError);
  // \u takes four hex digits, as in Jinja2 (found by fuzz/fuzz_chat_template.cpp: "\user" was
  // std::invalid_argument, exit 1; "\u12'" read past the closing quote).
  EXPECT_EQ(render("{{ '\\u00e9\\u6F22' }}"), "\u00e9\u6f22");
  // A template must be UTF-8 (a cut sequence read past the end of the string).
  EXPECT_THROW(ChatTemplate("{{ 'a\xC3' | reverse }}", "t.jinja"), UserError);
  for (const char* bad : {"{{ '\\user' }}", "{{ '\\u12' }}", "{{ '\\u-001' }}", "{{ '\\u' }}"}) {
    EXPECT_THROW(ChatTemplate(bad, "t.jinja"), UserError) << bad;
  }
  try {
    render("\n\n{{ raise_exception('roles must alternate') }}");
    FAIL() << "raise_exception should throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("test.jinja:3: raise_exception: roles must alternate"),
              std::string::npos)
        << e.what();
  }
}

// Macros (gpt-oss's harmony template renders its tools and system message with them).
TEST(ChatTemplateMacros, PositionalKeywordAndDefaultArguments) {
  // A default is evaluated at the call, after the parameters before it; a missing argument
  // without one is undefined.
  EXPECT_EQ(render("{% macro m(a, b=a ~ '!', c='z') %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
                   "{{ m(1) }}|{{ m(1, 2) }}|{{ m(c=3, a=4) }}|{{ m() }}"),
            "11!z|12z|44!3|!z");
  EXPECT_EQ(render("{% macro m(x, is_nullable=false) %}{{ x }}{{ '?' if is_nullable }}"
                   "{% endmacro %}{{ m('a') }}{{ m('b', is_nullable=true) }}{{ m('c', true) }}"),
            "ab?c?");
  // A parameter shadows the variable of the same name even when no argument is given.
  EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}", {{"a", "outer"}}), "[]");
}

TEST(ChatTemplateMacros, TheCallIsTextForExpressionsAndFilters) {
  EXPECT_EQ(render("{% macro w(s) %}<{{ s }}>{% endmacro %}{{ w('ab')|length }} {{ w('a') + 'b' }} "
                   "{{ w('q') == '<q>' }} {{ w is defined }} {% set t = w('x') %}{{ t|upper }} "
                   "{{ [w(1), w(2)]|join(',') }}"),
            "4 <a>b True True <X> <1>,<2>");
  EXPECT_EQ(render("{{ m }}{% macro m() %}{% endmacro %}{{ m }}"), "<Macro 'm'>");
  // Whitespace control inside the body, and trim_blocks after {% endmacro %}.
  EXPECT_EQ(render("{%- macro m(x) -%}\n    {{- x }}\n    {%- if x %}\n        {{- '!' }}\n"
                   "    {%- endif %}\n{%- endmacro -%}\n[{{ m(1) }}]\n[{{ m(0) }}]"),
            "[1!]\n[0]");
}

TEST(ChatTemplateMacros, ScopeLocalsStayInsideNamespacesAreShared) {
  // The body sees the context and the template's top-level variables, not the caller's loop
  // variables; its sets are its own; a namespace's attribute set inside it is seen outside.
  EXPECT_EQ(render("{% set x = 'top' %}{% set ns = namespace(n=0) %}{% macro m(a) %}{% set x = a "
                   "%}{% set ns.n = ns.n + 1 %}{{ x }}/{{ messages|length }}/{{ i }}{% endmacro %}"
                   "{% for i in [1, 2] %}{{ m(i) }};{% endfor %}{{ x }} {{ ns.n }}",
                   {{"messages", Json::array({1, 2, 3})}}),
            "1/3/;2/3/;top 2");
  // A macro defined in a loop sees that loop's variables, and is gone after it.
  EXPECT_EQ(render("{% for i in ['a', 'b'] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}"
                   "{% endfor %}{{ m is defined }}"),
            "abFalse");
  // Loop controls inside a macro's body.
  EXPECT_EQ(render("{% macro m() %}{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}"
                   "{{ i }}{% endfor %}{% endmacro %}{{ m() }}{{ m() }}"),
            "0101");
}

TEST(ChatTemplateMacros, NestedAndRecursiveCalls) {
  // A macro calls one defined after it (looked up at the call), calls nest in arguments.
  EXPECT_EQ(render("{% macro outer(n) %}{{ inner(n) ~ inner(n + 1) }}{% endmacro %}{% macro "
                   "inner(k) %}({{ k }}){% endmacro %}{{ outer(1) }} {{ inner(outer(5)) }}"),
            "(1)(2) ((5)(6))");
  // Recursion over a nested schema, as gpt-oss's render_typescript_type.
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "a": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
      "b": {"type": "object", "properties": {"c": {"type": "integer"}}}}})");
  EXPECT_EQ(render("{% macro t(s) %}{% if s.type == 'array' %}{{ t(s['items']) }}[]{% elif s.type "
                   "== 'object' %}{{ '{' }}{% for k, v in s.properties.items() %}{{ k }}: "
                   "{{ t(v) }}{% if not loop.last %}, {% endif %}{% endfor %}{{ '}' }}{% else %}"
                   "{{ s.type }}{% endif %}{% endmacro %}{{ t(schema) }}",
                   {{"schema", schema}}),
            "{a: string[][], b: {c: integer}}");
  // 150 levels (deeper than any real template's) render.
  EXPECT_EQ(render("{% macro m(n) %}{% if n > 0 %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ m(150)|length }}"),
            "342");
}

TEST(ChatTemplateMacros, BadCallsAndDefinitionsAreErrors) {
  // Jinja2's messages (TypeError there).
  auto error = [](const std::string& src) {
    try {
      render(src);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(rendered)");
  };
  EXPECT_NE(error("{% macro m(a) %}{% endmacro %}\n{{ m(1, 2) }}")
                .find("test.jinja:2: macro 'm' takes not more than 1 argument(s)"),
            std::string::npos);
  EXPECT_NE(error("{% macro m(a) %}{% endmacro %}{{ m(z=1) }}")
                .find("macro 'm' takes no keyword argument 'z'"),
            std::string::npos);
  EXPECT_NE(error("{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}")
                .find("macro 'm' takes no keyword argument 'a'"),
            std::string::npos);
  EXPECT_NE(error("{{ m() }}{% macro m() %}{% endmacro %}").find("unknown function m()"),
            std::string::npos);
  EXPECT_NE(error("\n{% macro m(a=1, b) %}{% endmacro %}")
                .find("test.jinja:2: non-default argument 'b' follows default argument"),
            std::string::npos)
      << error("\n{% macro m(a=1, b) %}{% endmacro %}");
  EXPECT_THROW(ChatTemplate("{% macro m() %}never closed", "t.jinja"), UserError);
}

// The sandbox's budgets (docs/reliability.md): each hostile template of issue 51 stops at once
// with one line naming the template, its line and the limit, instead of a stack overflow, a
// hang or gigabytes of memory; real templates stay far below them.
std::string refusal(const std::string& src) {
  try {
    render(src);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(rendered)";
}

TEST(ChatTemplateSandbox, DeepNestingIsRefusedNotAStackOverflow) {
  const std::string parens =
      "{{ " + std::string(200000, '(') + "1" + std::string(200000, ')') + " }}";
  EXPECT_NE(refusal(parens).find("test.jinja:1: expressions nested more than 200 levels"),
            std::string::npos)
      << refusal(parens);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(refusal(nots + "1 }}").find("nested more than 200"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 100000; ++i) ifs += "{% if true %}\n";
  EXPECT_NE(refusal(ifs).find("blocks nested more than 200 levels"), std::string::npos)
      << refusal(ifs);
  // 150 levels (beyond any real template) still render.
  EXPECT_EQ(render("{{ " + std::string(150, '(') + "7" + std::string(150, ')') + " }}"), "7");
}

// The blocks' nesting is checked first, in one pass over the tags: 60,000 nested for-blocks are
// refused at once with the parser's message (it took more than 30 s: the split searched back to
// the start of the line for every tag, and the template is one line).
TEST(ChatTemplateSandbox, DeeplyNestedBlocksAreRefusedFirst) {
  std::string nested;
  for (int i = 0; i < 60000; ++i) nested += "{% for a in b %}";
  for (int i = 0; i < 60000; ++i) nested += "{% endfor %}";
  EXPECT_EQ(refusal(nested),
            "chat template: test.jinja:1: blocks nested more than 200 levels deep (the template "
            "sandbox's limit) (moe-train --limit template.nesting=N raises it)");
  // The line named is that of the block past the limit; an unclosed tag anywhere is named first,
  // as the split names it before the parser counts.
  std::string lines;
  for (int i = 0; i < 300; ++i) lines += "{% if true %}\n";
  EXPECT_NE(refusal(lines).find("test.jinja:200: blocks nested more than 200 levels"),
            std::string::npos)
      << refusal(lines);
  EXPECT_NE(refusal(lines + "{{ x").find("test.jinja:301: an unclosed tag"), std::string::npos)
      << refusal(lines + "{{ x");
  // 199 levels (the template's own body is the 200th) still parse.
  std::string deepest;
  for (int i = 0; i < 199; ++i) deepest += "{% if true %}";
  deepest += "x";
  for (int i = 0; i < 199; ++i) deepest += "{% endif %}";
  EXPECT_EQ(render(deepest), "x");
}

// A megabyte of blocks one after another (on one line) renders.
TEST(ChatTemplateSandbox, AMegabyteOfSequentialBlocksRenders) {
  const std::string block = "{% if true %}a{% endif %}{% for c in 'bc' %}{{ c }}{% endfor %}";
  std::string src, expected;
  while (src.size() < (size_t(1) << 20)) {
    src += block;
    expected += "abc";
  }
  EXPECT_EQ(render(src), expected);
}

TEST(ChatTemplateSandbox, MacroRecursionAndCallsHaveBudgets) {
  // A macro calling itself without end stops at the nesting limit (Jinja2: RecursionError).
  EXPECT_NE(refusal("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}\n{{ m(0) }}")
                .find("test.jinja:1: macro calls nested more than 200 levels deep (the template "
                      "sandbox's limit)"),
            std::string::npos)
      << refusal("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}\n{{ m(0) }}");
  // Each level nested 190 deep in blocks and expressions: the renderer's depth limit stops it
  // before the stack runs out.
  std::string deep = "{% macro m(n) %}";
  for (int i = 0; i < 95; ++i) deep += "{% for i in [1] %}";
  deep += "{{ " + std::string(95, '[') + "m(n + 1)" + std::string(95, ']') + " }}";
  for (int i = 0; i < 95; ++i) deep += "{% endfor %}";
  deep += "{% endmacro %}{{ m(0) }}";
  EXPECT_NE(refusal(deep).find("rendering nested more than 2000 levels deep"), std::string::npos)
      << refusal(deep);
  // A long chain of operators (unbounded by the parser) evaluates within the same limit.
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_NE(refusal(chain + " }}").find("rendering nested more than 2000 levels deep"),
            std::string::npos);
  // Calls doubling at each level: 2^31 of them stop at the call budget.
  EXPECT_NE(refusal("{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}"
                    "{% endmacro %}{{ m(30) }}")
                .find("more than 1000000 macro calls in one rendering"),
            std::string::npos);
  // The output held by the callers counts toward the size budget: 100 levels of 60 MB each
  // stop at 64 MiB, not at 6 GB.
  EXPECT_NE(refusal("{% macro m(n) %}{{ 'x' * 60000000 }}{% if n %}{{ m(n - 1) }}{% endif %}"
                    "{% endmacro %}{{ m(100) }}")
                .find("64 MiB"),
            std::string::npos);
}

TEST(ChatTemplateSandbox, RangeLoopsAndSizesHaveBudgets) {
  EXPECT_NE(refusal("x\n{% for i in range(1000000000) %}{% endfor %}")
                .find("test.jinja:2: range() of 1000000000 items: more than the template "
                      "sandbox's 100000"),
            std::string::npos);
  EXPECT_EQ(render("{{ range(100000)|length }}"), "100000");  // Jinja2's MAX_RANGE itself
  EXPECT_NE(refusal("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}")
                .find("more than 1000000 loop iterations"),
            std::string::npos);
  // A string doubled 40 times stops at the 64 MiB budget.
  EXPECT_NE(refusal("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}")
                .find("more than the template sandbox's 64 MiB"),
            std::string::npos);
  EXPECT_NE(refusal("{{ 'ab' * 100000000000 }}").find("64 MiB"), std::string::npos);
  EXPECT_NE(refusal("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").find("64 MiB"),
            std::string::npos);
  EXPECT_EQ(render("{{ ('ab' * 3) ~ 'c' }}"), "abababc");
}

// Found by fuzz/fuzz_chat_template.cpp (tests/corpus/fuzz-regressions/chat_template-*): lists
// built in a loop had no budget (a list doubled 40 times took gigabytes; one wrapped in itself
// 100,000 times was quadratic and then a stack overflow when printed), and integer arithmetic
// past 64 bits was undefined behaviour.
TEST(ChatTemplateSandbox, BuiltListsAndIntegersHaveBounds) {
  EXPECT_NE(refusal("{% set ns = namespace(x=[1]) %}{% for i in range(40) %}"
                    "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|length }}")
                .find("more than the template sandbox's 1000000 items"),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(x=[1]) %}{% for i in range(40) %}"
                    "{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}")
                .find("1000000 items"),
            std::string::npos);
  EXPECT_NE(refusal("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                    "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}")
                .find("lists or dicts nested more than 200 deep"),
            std::string::npos);
  EXPECT_EQ(render("{{ ([1, 2] + [3])|length }} {{ {'a': [1]}['a'][0] }}"), "3 1");
  for (const char* overflow :
       {"{{ 9223372036854775807 + 1 }}", "{{ -(-9223372036854775807 - 1) }}",
        "{{ (-9223372036854775807 - 1) // -1 }}", "{{ 4294967296 * 4294967296 }}",
        "{{ 99999999999999999999 }}", "{{ (1.0 * 10000000000 * 10000000000)|int }}"}) {
    EXPECT_NE(refusal(overflow).find("64 bits"), std::string::npos)
        << overflow << refusal(overflow);
  }
  // Python's floor division and modulo, exact at the ends of the range.
  EXPECT_EQ(
      render(
          "{{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 2 }} {{ 7 % -2 }} {{ 9223372036854775807 // 1 }}"),
      "-4 -4 1 -1 9223372036854775807");
  EXPECT_EQ(render("{{ 9007199254740993|int }}"), "9007199254740993");
}

}  // namespace
}  // namespace moe::chat

namespace moe::chat {
namespace {

// Expected strings are jinja2 3.1's output for the same templates.
TEST(ChatTemplate, DictsortAndMapWithAFilter) {
  const Json ctx = {{"d", {{"b", 1}, {"B", 2}, {"a", 3}, {"c", 0}}}};
  const std::string loop = "{% for k, v in d | dictsort";
  const std::string body = " %}{{ k }}{{ v }}{% endfor %}";
  EXPECT_EQ(render(loop + body, ctx), "a3b1B2c0");  // case-insensitive, stable
  EXPECT_EQ(render(loop + "(true)" + body, ctx), "B2a3b1c0");
  EXPECT_EQ(render(loop + "(reverse=true)" + body, ctx), "c0b1B2a3");
  EXPECT_EQ(render(loop + "(by='value')" + body, ctx), "c0b1B2a3");
  EXPECT_EQ(render("{{ ['a', 'b'] | map('upper') | list }}"), "['A', 'B']");
  EXPECT_EQ(render("{{ ['a-b', 'c'] | map('replace', '-', '+') | join(',') }}"), "a+b,c");
  EXPECT_THROW(render("{{ [1] | dictsort }}"), std::exception);
  EXPECT_THROW(render("{{ [1] | map('no_such_filter') | list }}"), std::exception);
}

// Kimi-K2's template queues tool-call ids in a namespace's list: append and pop change it in place
// (transformers' immutable sandbox refuses both; Python and jinja2 outside it do this).
TEST(ChatTemplate, ListAppendAndPopInPlace) {
  EXPECT_EQ(render("{% set ns = namespace(ids=[]) %}{% set _ = ns.ids.append(1) %}"
                   "{% set _ = ns.ids.append('a') %}{{ ns.ids.pop(0) }}{{ ns.ids }}"),
            "1['a']");
  EXPECT_EQ(render("{% set xs = [1, 2, 3] %}{{ xs.pop() }}{{ xs }}{{ xs.pop(-2) }}{{ xs }}"),
            "3[1, 2]1[2]");
  EXPECT_THROW(render("{% set xs = [] %}{{ xs.pop() }}"), std::exception);
  EXPECT_THROW(render("{% set xs = [1] %}{{ xs.append() }}"), std::exception);
}

}  // namespace
}  // namespace moe::chat
