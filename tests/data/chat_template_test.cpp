// The chat-template evaluator on the Jinja features the families' templates use (each expected
// string is what Python's jinja2, with transformers' trim_blocks and lstrip_blocks, renders), its
// errors, and Python-style tojson. tests/data/sft_data_test.py checks whole templates against
// transformers.
#include <gtest/gtest.h>

#include "moe/data/chat_template.h"
#include "moe/util/errors.h"

namespace moe::data {
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
    ChatTemplate("ok\n{% macro m() %}{% endmacro %}", "t.jinja");
    FAIL() << "a macro should be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("macro"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate("{% if x %}never closed", "t.jinja"), UserError);
  EXPECT_THROW(ChatTemplate("{{ 'unterminated }}", "t.jinja"), UserError);
  try {
    render("\n\n{{ raise_exception('roles must alternate') }}");
    FAIL() << "raise_exception should throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("test.jinja:3: raise_exception: roles must alternate"),
              std::string::npos)
        << e.what();
  }
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

}  // namespace
}  // namespace moe::data
