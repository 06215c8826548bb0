#include <catch2/catch.hpp>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "text/chat_template.hpp"

using namespace computron;
using namespace computron::text;
using ojson = nlohmann::ordered_json;

namespace {

/// `source` rendered with `context` (JSON text); the test fails where either step fails.
std::string rendered(const std::string& source, const std::string& context = "{}") {
  INFO("template: " << source);
  auto t = chat_template::parse(source);
  INFO((t ? "" : render(t.error())));
  REQUIRE(t);
  auto out = (*t)->render(ojson::parse(context));
  INFO((out ? "" : render(out.error())));
  REQUIRE(out);
  return *out;
}

/// The refusal of `source` at parse time (ec::invalid_configuration), rendered.
std::string parse_error(const std::string& source) {
  INFO("template: " << source);
  auto t = chat_template::parse(source);
  REQUIRE_FALSE(t);
  CHECK(is(t.error(), ec::invalid_configuration));
  return render(t.error());
}

/// The refusal of `source` at render time (ec::invalid_request), rendered.
std::string render_error(const std::string& source, const std::string& context = "{}") {
  INFO("template: " << source);
  auto t = chat_template::parse(source);
  INFO((t ? "" : render(t.error())));
  REQUIRE(t);
  auto out = (*t)->render(ojson::parse(context));
  REQUIRE_FALSE(out);
  CHECK(is(out.error(), ec::invalid_request));
  return render(out.error());
}

}  // namespace

TEST_CASE("text, expressions and comments render, and one final newline is dropped",
          "[models][chat_template]") {
  CHECK(rendered("plain text") == "plain text");
  CHECK(rendered("a{{ 'b' }}c{# a comment #}d") == "abcd");
  CHECK(rendered("a\n") == "a");
  CHECK(rendered("a\n\n") == "a\n");
  CHECK(rendered("{{ 'x' }}\ny") == "x\ny");  // expressions keep their newline
  CHECK(rendered("{ not a tag } {x}") == "{ not a tag } {x}");
  CHECK(rendered("{{ {'a': {'b': 1}} }}") == "{'a': {'b': 1}}");  // '}}' inside a dict
  // Jinja reads \r\n and \r as \n, in text and in string literals.
  CHECK(rendered("a\r\n{% if true %}\r\nb\r{{ 'c\r\nd' }}{% endif %}\r\n") == "a\nb\nc\nd");
}

TEST_CASE("whitespace follows trim_blocks and lstrip_blocks, '-' strips, '+' keeps",
          "[models][chat_template]") {
  CHECK(rendered("a\n{% if true %}\n  b\n{% endif %}\nc") == "a\n  b\nc");
  CHECK(rendered("x\n    {% if true %}y{% endif %}") == "x\ny");
  CHECK(rendered("x  {% if true %}y{% endif %}") == "x  y");  // not at a line start
  CHECK(rendered("x\n\t {%+ if true %}y{% endif %}") == "x\n\t y");
  CHECK(rendered("a  \n  {%- if true -%}  \n  b  {%- endif %}") == "ab");
  CHECK(rendered("a  {{- 'b' -}}  \n c") == "abc");
  CHECK(rendered("a\n{# note #}\nb") == "a\nb");
  CHECK(rendered("a {#- note -#} b") == "ab");
  CHECK(rendered("{% for x in [1, 2] %}\n  {{ x }}\n{% endfor %}\n") == "  1\n  2\n");
  CHECK(rendered("{%- if true %}\n\n{%- endif %}") == "");
}

TEST_CASE("literals print as Python prints them", "[models][chat_template]") {
  CHECK(
      rendered("{{ 42 }} {{ -7 }} {{ 1.0 }} {{ 2.50 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 2.5e-5 }}") ==
      "42 -7 1.0 2.5 0.30000000000000004 1e+20 2.5e-05");
  CHECK(rendered("{{ 1_000 }} {{ 7 / 7 }} {{ 1e16 }} {{ 123456789.0 }}") ==
        "1000 1.0 1e+16 123456789.0");
  CHECK(rendered("{{ true }} {{ False }} {{ none }} {{ None }}") == "True False None None");
  CHECK(rendered(R"({{ 'it\'s' }} {{ "say \"hi\"" }} {{ 'a\tb' }} {{ '\u00e9\x41' }})") ==
        "it's say \"hi\" a\tb \xC3\xA9"
        "A");
  CHECK(rendered(R"({{ 'back\\slash' }} {{ '\d' }} {{ 'a' "b" 'c' }})") == "back\\slash \\d abc");
  CHECK(rendered("{{ 'line\\nbreak' }}") == "line\nbreak");
  CHECK(rendered("{{ ['a', 1, 2.5, true, none] }}") == "['a', 1, 2.5, True, None]");
  CHECK(rendered("{{ {'k': 'v', 'n': [1, {'x': none}]} }}") == "{'k': 'v', 'n': [1, {'x': None}]}");
  CHECK(rendered("{{ (1,) }} {{ (1, 'b') }} {{ () }}") == "(1,) (1, 'b') ()");
  CHECK(rendered(R"({{ ["it's", 'say "x"', 'a\nb', '\\'] }})") ==
        R"(["it's", 'say "x"', 'a\nb', '\\'])");
  CHECK(rendered("{{ [] }} {{ {} }} {{ [[]] }}") == "[] {} [[]]");
}

TEST_CASE("if, elif and else choose by Python truthiness", "[models][chat_template]") {
  const std::string t =
      "{% if x == 1 %}one{% elif x == 2 %}two{% elif x %}some{% else %}none{% endif %}";
  CHECK(rendered(t, R"({"x": 1})") == "one");
  CHECK(rendered(t, R"({"x": 2})") == "two");
  CHECK(rendered(t, R"({"x": "z"})") == "some");
  CHECK(rendered(t, R"({"x": 0})") == "none");
  CHECK(rendered(t) == "none");
  for (auto falsy : {"0", "0.0", "''", "[]", "{}", "none", "false", "undefined_name"})
    CHECK(rendered(std::string{"{% if "} + falsy + " %}t{% else %}f{% endif %}") == "f");
  for (auto truthy : {"1", "-0.5", "' '", "[0]", "{'a': 0}", "true", "namespace()"})
    CHECK(rendered(std::string{"{% if "} + truthy + " %}t{% else %}f{% endif %}") == "t");
}

TEST_CASE("for loops: loop variables, filters, else, unpacking and loop controls",
          "[models][chat_template]") {
  CHECK(rendered("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}"
                 "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}"
                 "{{ loop.length }}{{ x }}|{% endfor %}") ==
        "1032TrueFalse3a|2121FalseFalse3b|3210FalseTrue3c|");
  CHECK(rendered("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") ==
        "a=1;b=2;");
  CHECK(rendered("{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}") == "xy");
  CHECK(rendered("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}",
                 R"({"d": {"z": 1, "a": 2}})") == "z1a2");
  CHECK(rendered("{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}") == "3 7 ");
  CHECK(rendered("{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}"
                 "{% endfor %}") == "1,3,5,7,9");
  CHECK(rendered("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(rendered("{% for x in [1] if x > 5 %}x{% else %}filtered{% endfor %}") == "filtered");
  CHECK(rendered("{% for x in missing %}x{% endfor %}") == "");
  CHECK(rendered("{% for c in 'h\xC3\xA9!' %}{{ c }}.{% endfor %}") == "h.\xC3\xA9.!.");
  CHECK(rendered("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} "
                 "{% endfor %}{{ loop.index }};{% endfor %}") == "1x1 1y2 1;2x1 2y2 2;");
  CHECK(rendered("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                 "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "0134");
  CHECK(rendered("{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} "
                 "{% endfor %}") == "<1>2 1<2>3 2<3> ");
  CHECK_THAT(render_error("{% for a, b in [1] %}{% endfor %}"),
             Catch::Contains("cannot unpack non-iterable int object"));
  CHECK_THAT(render_error("\n{% for x in 5 %}{% endfor %}"),
             Catch::Contains("line 2: 'int' object is not iterable"));
}

TEST_CASE("set assigns in the current scope, and namespaces carry values out of loops",
          "[models][chat_template]") {
  CHECK(rendered("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
  // Each iteration starts afresh, as in Jinja: the last iteration's set is gone.
  CHECK(rendered("{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}{% endfor %}") ==
        "[0][0]");
  CHECK(rendered("{% for x in [1, 2] %}{{ x }}{% endfor %}[{{ x }}]") == "12[]");
  CHECK(rendered("{% if true %}{% set y = 5 %}{% endif %}{{ y }}") == "5");
  CHECK(rendered("{% set ns = namespace(total=1) %}{% for i in [1, 2] %}"
                 "{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}") == "4");
  CHECK(rendered("{% set a, b = 1, 2 %}{{ a }}{{ b }}") == "12");
  CHECK(rendered("{% set t = 1, 'x' %}{{ t }}") == "(1, 'x')");
  CHECK(rendered("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]") == "[inner 2]");
  CHECK(rendered("{% set x %}{% set y = 1 %}{% endset %}[{{ y }}]") == "[]");
  CHECK(rendered("{% set messages = messages[1:] %}{{ messages | length }}",
                 R"({"messages": [1, 2, 3]})") == "2");
  CHECK_THAT(render_error("{% set d = {} %}{% set d.x = 1 %}"),
             Catch::Contains("cannot assign attribute on non-namespace object"));
}

TEST_CASE("macros take positional, keyword and default arguments", "[models][chat_template]") {
  const std::string m =
      "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!"
      "{% endmacro %}";
  CHECK(rendered(m + "{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} "
                     "{{ greet(greeting='Yo', name='Cy') }} [{{ greet() }}]") ==
        "Hello, Ann! Hi, Bob! Yo, Cy! [Hello, !]");
  CHECK(rendered("{% set sfx = '!' %}{% macro m(x) %}{{ x }}{{ sfx }}{% endmacro %}{{ m(1) }}") ==
        "1!");
  CHECK(rendered("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                 "{{ f(3) }}") == "321");
  CHECK(rendered("{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(4) }}") == "8");
  // An argument given as undefined stays so; only a missing one takes the default.
  CHECK(rendered("{% macro m(a=1) %}[{{ a }}]{% endmacro %}{{ m(missing) }}{{ m() }}") == "[][1]");
  // A macro's sets stay inside it.
  CHECK(rendered("{% macro m() %}{% set z = 1 %}{{ z }}{% endmacro %}{{ m() }}[{{ z }}]") == "1[]");
  // Names in a macro resolve when it runs: b is defined by then.
  CHECK(rendered("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}B{% endmacro %}{{ a() }}") ==
        "B");
  CHECK_THAT(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
             Catch::Contains("macro calls nested too deeply"));
  CHECK_THAT(render_error(m + "{{ greet(1, 2, 3) }}"),
             Catch::Contains("macro 'greet' takes not more than 2 argument(s)"));
  CHECK_THAT(render_error(m + "{{ greet(x=1) }}"),
             Catch::Contains("macro 'greet' takes no keyword argument 'x'"));
}

TEST_CASE("generation blocks render their body", "[models][chat_template]") {
  CHECK(rendered("{% generation %}{{ 'x' }}{% endgeneration %}") == "x");
  CHECK(rendered("a\n{% generation %}\nb\n{% endgeneration %}\nc") == "a\nb\nc");
  CHECK(rendered("a {%- generation -%} b {%- endgeneration %}") == "ab");
}

TEST_CASE("attributes, subscripts and slices, where a missing key is undefined",
          "[models][chat_template]") {
  const std::string ctx = R"({"m": {"role": "user", "n": {"k": "v"}}, "xs": [1, 2, 3]})";
  CHECK(rendered("{{ m['role'] }}{{ m.role }}{{ m.n.k }}{{ m['n']['k'] }}", ctx) == "useruservv");
  CHECK(rendered("[{{ m.missing }}|{{ m['missing'] }}|{{ m.missing is defined }}]", ctx) ==
        "[||False]");
  CHECK(rendered("{{ xs[-1] }}{{ xs[0] }}{{ xs.1 }}[{{ xs[10] }}]", ctx) == "312[]");
  CHECK(rendered("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::2] }} {{ xs[5:] }}", ctx) ==
        "[3, 2, 1] [2, 3] [1, 2] [1, 3] []");
  CHECK(rendered("{{ 'hello'[1:3] }} {{ 'h\xC3\xA9llo'[::-1] }} {{ 'h\xC3\xA9'[1] }}") ==
        "el oll\xC3\xA9h \xC3\xA9");
  CHECK(rendered("{{ (1, 2, 3)[1:] }}") == "(2, 3)");
  CHECK_THAT(render_error("{{ xs[::0] }}", ctx), Catch::Contains("slice step cannot be zero"));
}

TEST_CASE("arithmetic and concatenation follow Python", "[models][chat_template]") {
  CHECK(rendered("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -2 ** 2 }}") ==
        "7 9 1024 0.5 4");
  CHECK(
      rendered("{{ 7 // 2 }} {{ 7 % 3 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 10 / 4 }}") ==
      "3 1 -4 2 3.0 2.5");
  CHECK(rendered("{{ 1 + 2.0 }} {{ true + 1 }} {{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [1] + [2] }}") ==
        "3.0 2 ab ababab [1, 2]");
  CHECK(rendered("{{ 'a' ~ 1 ~ none ~ missing ~ [1] }}") == "a1None[1]");
  CHECK(rendered("{{ xs | length - 1 }} {{ 'a' ~ 'b' | upper }}", R"({"xs": [1, 2]})") == "1 aB");
  CHECK_THAT(render_error("a\nb\n{{ 1 + 'x' }}"),
             Catch::Contains("chat template line 3: unsupported operand type(s) for +: 'int' and "
                             "'str'"));
  CHECK_THAT(render_error("{{ 1 / 0 }}"), Catch::Contains("division by zero"));
  CHECK_THAT(render_error("{{ 1 // 0 }}"), Catch::Contains("division or modulo by zero"));
  CHECK_THAT(render_error("{{ 9223372036854775807 + 1 }}"), Catch::Contains("integer overflow"));
  CHECK_THAT(render_error("{{ missing + 1 }}"), Catch::Contains("'missing' is undefined"));
}

TEST_CASE("comparisons, membership, logic and conditional expressions", "[models][chat_template]") {
  CHECK(
      rendered("{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ [1, 2] == [1, 2] }}"
               "{{ 'a' < 'b' }}{{ [1] == (1,) }}{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}") ==
      "TrueTrueTrueFalseTrueTrueFalseTrue");
  CHECK(rendered("{{ 'ell' in 'hello' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}"
                 "{{ 'x' in missing }}{{ not true }}{{ not 1 == 2 }}") ==
        "TrueTrueTrueTrueFalseFalseTrue");
  CHECK(rendered("{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ [] or 'empty' }}|{{ none and 1 }}") ==
        "x|b|empty|None");
  CHECK(rendered("{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}[{{ 'y' if 0 }}]"
                 "{{ 'a' if 0 else 'b' if 1 else 'c' }}") == "yn[]b");
  CHECK(rendered("{{ missing == missing }}{{ missing == none }}{{ missing != 1 }}") ==
        "TrueFalseTrue");
  CHECK_THAT(render_error("{{ none < 1 }}"),
             Catch::Contains("'<' not supported between instances of 'NoneType' and 'int'"));
}

TEST_CASE("tests, negated with 'is not'", "[models][chat_template]") {
  CHECK(rendered("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ none is none }}"
                 "{{ x is not none }}",
                 R"({"x": 1})") == "TrueFalseTrueTrueTrue");
  CHECK(rendered("{{ 'a' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}") ==
        "TrueFalseTrueFalse");
  CHECK(rendered("{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}"
                 "{{ {} is sequence }}") == "TrueTrueFalseTrueTrue");
  CHECK(rendered("{{ 1 is number }}{{ 1.5 is number }}{{ 'a' is number }}{{ 1 is integer }}"
                 "{{ 1.5 is integer }}{{ true is integer }}{{ 1.5 is float }}") ==
        "TrueTrueFalseTrueFalseFalseTrue");
  CHECK(rendered("{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}"
                 "{{ false is false }}{{ 0 is false }}{{ 1 is not string }}") ==
        "TrueFalseTrueFalseTrueFalseTrue");
  CHECK(rendered("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby(3) }}{{ 9 is divisibleby 4 }}"
                 "{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ 2 is equalto(3) }}{{ 'ab' is lower }}") ==
        "TrueTrueTrueFalseTrueTrueFalseTrue");
  CHECK(rendered("{{ x is defined and x > 0 }}{{ not x is defined }}", "{}") == "FalseTrue");
}

TEST_CASE("string methods follow Python's str", "[models][chat_template]") {
  CHECK(
      rendered(R"({{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\n\n a\n'.lstrip('\n') }}|)"
               R"({{ 'a \n\n'.rstrip('\n') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|)") ==
      "a b|a| a\n|a |a | a|");
  CHECK(rendered("{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} "
                 "{{ 'a-b-c'.rsplit('-', 1) }} {{ ' a b c '.split(none, 1) }}") ==
        "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b-c'] ['a-b', 'c'] ['a', 'b c ']");
  CHECK(rendered("{{ 'x</think>y'.split('</think>')[-1] }} {{ 'abc'.split('z') }}") == "y ['abc']");
  CHECK(rendered("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}"
                 "{{ 'hello'.startswith('lo') }}") == "TrueTrueFalse");
  CHECK(rendered("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'a.b'.replace('.', '') }} "
                 "{{ 'ab'.replace('', '-') }}") == "bba ab -a-b-");
  CHECK(rendered("{{ 'h\xC3\xA9llo wORLD'.upper() }} {{ 'H\xC3\x89LLO'.lower() }} "
                 "{{ \"they're bill's\".title() }} {{ 'hELLO wORLD'.capitalize() }}") ==
        "H\xC3\x89LLO WORLD h\xC3\xA9llo They'Re Bill'S Hello world");
  CHECK(rendered("{{ 'h\xC3\xA9llo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('a') }} "
                 "{{ ', '.join(['a', 'b']) }}") == "2 -1 3 a, b");
  CHECK_THAT(render_error("{{ 'a'.startswith(1) }}"), Catch::Contains("must be str"));
  CHECK_THAT(render_error("{{ (1).strip() }}"),
             Catch::Contains("'int' object has no attribute 'strip'"));
  CHECK_THAT(render_error("{{ 'a'.split('') }}"), Catch::Contains("empty separator"));
}

TEST_CASE("dict methods", "[models][chat_template]") {
  const std::string d = R"({"d": {"a": 1, "b": 2}})";
  CHECK(rendered("{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", d) ==
        "['a', 'b'] [1, 2] [('a', 1), ('b', 2)]");
  CHECK(rendered("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }}", d) == "1 None 0");
}

TEST_CASE("filters", "[models][chat_template]") {
  const std::string ctx = R"({"users": [{"name": "a", "age": 1}, {"name": "b"}],
      "msgs": [{"role": "system"}, {"role": "user"}, {"role": "user"}]})";
  CHECK(rendered("{{ '  x \n' | trim }}|{{ 'xxhixx' | trim('x') }}") == "x|hi");
  CHECK(rendered("{{ 'h\xC3\xA9llo' | length }}{{ [1, 2] | count }}{{ {'a': 1} | length }}"
                 "{{ missing | length }}") == "5210");
  CHECK(rendered(
            "{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }}[{{ [] | first }}]") ==
        "13a[]");
  CHECK(rendered("{{ [1, 'a', none] | join(', ') }}|{{ users | join(',', attribute='name') }}|"
                 "{{ 'abc' | join('-') }}",
                 ctx) == "1, a, None|a,b|a-b-c");
  CHECK(rendered("{{ missing | default('x') }}{{ missing | d('y') }}{{ '' | default('z') }}"
                 "{{ '' | default('z', true) }}{{ none | default('n') }}") == "xyzNone");
  CHECK(rendered("{{ {'a': 1} | items | list }} {{ 'ab' | list }} {{ missing | items | list }}") ==
        "[('a', 1)] ['a', 'b'] []");
  CHECK(rendered("{{ 'hello world' | upper }} {{ 'HeLLo' | lower }} {{ 'hELLO' | capitalize }} "
                 "{{ \"it's-a test\" | title }}") == "HELLO WORLD hello Hello It's-A Test");
  CHECK(rendered("{{ 1 | string ~ 'x' }} {{ [1] | string }} {{ none | string }}") == "1x [1] None");
  CHECK(rendered("{{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} "
                 "{{ '0x1A' | int(base=16) }} {{ 3.9 | int }} {{ true | int }}") ==
        "43 4 0 7 26 3 1");
  CHECK(rendered("{{ '2.5' | float }} {{ 3 | float }} {{ 'x' | float }}") == "2.5 3.0 0.0");
  CHECK(rendered("{{ -3 | abs }} {{ -2.5 | abs }}") == "3 2.5");
  CHECK(rendered("{{ 'aXbX' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 1) }} "
                 "{{ '<b>' | safe }}") == "a-b- baa <b>");
  CHECK(rendered("{{ ['a', 'A', 'b', 'a'] | unique | list }} {{ [3, 1, 3] | unique | list }}") ==
        "['a', 'b'] [3, 1]");
  CHECK(rendered("{{ users | map(attribute='name') | join(',') }} "
                 "{{ users | map(attribute='age', default=0) | list }} "
                 "{{ ['a', 'b'] | map('upper') | join }}",
                 ctx) == "a,b [1, 0] AB");
  CHECK(
      rendered("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} "
               "{{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='role') | first }} "
               "{{ users | selectattr('age') | map(attribute='name') | list }} "
               "{{ users | rejectattr('age', 'defined') | map(attribute='name') | list }}",
               ctx) == "2 system ['a'] ['b']");
  CHECK(rendered(
            "{{ range(6) | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} "
            "{{ range(4) | reject('equalto', 2) | list }} {{ [1, 5] | select('>', 2) | list }}") ==
        "[1, 3, 5] [1, 'a'] [0, 1, 3] [5]");
  CHECK(rendered("{{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}") == "[3, 2, 1] cba");
  CHECK(
      rendered("{{ ['b', 'A', 'c'] | sort }} "
               "{{ users | sort(attribute='name', reverse=true) | map(attribute='name') | join }}",
               ctx) == "['A', 'b', 'c'] ba");
  CHECK(rendered("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|"
                 "{{ 'a\n\nb' | indent('> ', blank=true) }}") ==
        "a\n  b\n\n  c|  a\n  b|a\n> \n> b");
}

TEST_CASE("filters that give generators and methods that give views behave as in Python",
          "[models][chat_template]") {
  // A generator is true even when it would yield nothing, and has no length.
  CHECK(rendered("{% if [] | select('odd') %}T{% else %}F{% endif %}") == "T");
  CHECK(rendered("{% if [] | select('odd') | list %}T{% else %}F{% endif %}") == "F");
  CHECK_THAT(render_error("{{ [1, 2] | select('odd') | length }}"),
             Catch::Contains("object of type 'generator' has no len()"));
  CHECK(rendered("{{ [1, 2] | map('string') | first }}{{ [1, 2] | reverse | join }}") == "121");
  CHECK(rendered("{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ {'a': 1}.values() | length }}") ==
        "dict_items([('a', 1)]) dict_keys(['a']) 1");
  CHECK(rendered("{{ {'a': 1}.keys() == {'a': 2}.keys() }}{{ [1, 2] | select is sequence }}") ==
        "TrueFalse");
}

TEST_CASE("tojson formats as Python's json.dumps does for transformers",
          "[models][chat_template]") {
  const std::string ctx =
      R"({"v": {"b": 1, "a": [1, 2.5, "x\"y\n\u0001", true, null], "u": "é😀", "e": {}, "l": []}})";
  CHECK(rendered("{{ v | tojson }}", ctx) ==
        R"({"b": 1, "a": [1, 2.5, "x\"y\n\u0001", true, null], "u": "é😀", "e": {}, "l": []})");
  CHECK(rendered("{{ v | tojson(indent=2) }}", ctx) ==
        "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    \"x\\\"y\\n\\u0001\",\n    true,\n"
        "    null\n  ],\n  \"u\": \"é😀\",\n  \"e\": {},\n  \"l\": []\n}");
  CHECK(rendered("{{ v.u | tojson(ensure_ascii=true) }}", ctx) == R"("\u00e9\ud83d\ude00")");
  CHECK(rendered("{{ v | tojson(sort_keys=true, separators=(',', ':')) }}", ctx) ==
        R"({"a":[1,2.5,"x\"y\n\u0001",true,null],"b":1,"e":{},"l":[],"u":"é😀"})");
  CHECK(rendered("{{ 'a<b>&\\'' | tojson }} {{ 1.0 | tojson }} {{ (1, 'x') | tojson }}") ==
        R"("a<b>&'" 1.0 [1, "x"])");
  CHECK_THAT(render_error("{{ missing | tojson }}"), Catch::Contains("Undefined is not JSON"));
  CHECK_THAT(render_error("{{ {'a': 1}.items() | tojson }}"),
             Catch::Contains("dict_items is not JSON serializable"));
  // An ordered_json context keeps its key order; nlohmann::json sorts keys when it parses.
  auto t = chat_template::parse("{{ d | tojson }}");
  REQUIRE(t);
  CHECK(*(*t)->render(ojson::parse(R"({"d": {"z": 1, "a": 2}})")) == R"({"z": 1, "a": 2})");
  CHECK(*(*t)->render(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})")) ==
        R"({"a": 2, "z": 1})");
}

TEST_CASE("globals: range, namespace, dict, raise_exception, strftime_now",
          "[models][chat_template]") {
  CHECK(rendered("{{ range(3) | list }}{{ range(1, 4) | list }}{{ range(5, 0, -2) | list }}") ==
        "[0, 1, 2][1, 2, 3][5, 3, 1]");
  CHECK(rendered("{% set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}{% set ns.a = 2 %}"
                 "{{ ns.a }}{{ ns.missing is defined }}") == "1x2False");
  CHECK(rendered("{% set ns = namespace({'k': 'v'}) %}{{ ns.k }}") == "v");
  CHECK(rendered("{{ dict(a=1, b=2) }} {{ dict() }}") == "{'a': 1, 'b': 2} {}");
  auto t = chat_template::parse(
      "a\n{% if x %}{{ raise_exception('Roles must alternate!') }}"
      "{% endif %}");
  REQUIRE(t);
  auto refused = (*t)->render(ojson{{"x", true}});
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_request));
  CHECK(render(refused.error()) == "invalid_request: Roles must alternate!");
  auto year = rendered("{{ strftime_now('%Y') }}");
  CHECK(year.size() == 4);
  CHECK(year.find_first_not_of("0123456789") == std::string::npos);
  CHECK_FALSE(rendered("{{ strftime_now('%d %B %Y') }}").empty());
  CHECK_THAT(render_error("{{ range(1, 2, 0) }}"), Catch::Contains("must not be zero"));
  CHECK_THAT(render_error("{{ range(100001) }}"), Catch::Contains("Range too big"));
  CHECK(rendered("{{ range(100000) | length }}") == "100000");
}

TEST_CASE("undefined values print empty, and using one otherwise is an error with the line",
          "[models][chat_template]") {
  CHECK(rendered("[{{ nothing }}]{% if nothing %}y{% else %}n{% endif %}{{ nothing ~ 'a' }}") ==
        "[]na");
  CHECK_THAT(render_error("\n\n{{ nothing.attr }}"),
             Catch::Contains("chat template line 3: 'nothing' is undefined"));
  CHECK_THAT(render_error("{{ m.missing.deeper }}", R"({"m": {}})"),
             Catch::Contains("'dict object' has no attribute 'missing'"));
  CHECK_THAT(render_error("{% if false %}{% macro m() %}{% endmacro %}{% endif %}{{ m() }}"),
             Catch::Contains("'m' is undefined"));
  CHECK_THAT(render_error("{{ range(2) }}", R"({"range": 1})"),
             Catch::Contains("'int' object is not callable"));
  CHECK_THAT(render_error("{{ m.content.strip() }}", R"({"m": {}})"),
             Catch::Contains("no attribute 'content'"));
  CHECK_THAT(render_error("{{ messages[0].role }}", R"({"messages": []})"),
             Catch::Contains("list object has no element 0"));
}

TEST_CASE("constructs the interpreter lacks are refused at parse time, named with their line",
          "[models][chat_template]") {
  CHECK_THAT(parse_error("one\ntwo\n{{ x | wordcount }}"),
             Catch::Equals("invalid_configuration: chat template line 3: filter 'wordcount' is "
                           "not supported"));
  for (auto tag : {"include", "extends", "call", "filter", "raw", "do", "with", "block", "import",
                   "from", "autoescape"})
    CHECK_THAT(parse_error(std::string{"\n{% "} + tag + " x %}"),
               Catch::Contains(std::string{"line 2: tag '"} + tag + "' is not supported"));
  CHECK_THAT(parse_error("{{ x is sameas y }}"), Catch::Contains("test 'sameas' is not supported"));
  CHECK_THAT(parse_error("{{ 'a'.format(1) }}"),
             Catch::Contains("method 'format' is not supported"));
  CHECK_THAT(parse_error("{{ xs.append(1) }}"),
             Catch::Contains("method 'append' is not supported"));
  CHECK_THAT(parse_error("{% for x in y %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
             Catch::Contains("method 'cycle' is not supported"));
  CHECK_THAT(parse_error("a\n\n\n{{ foo(1) }}"),
             Catch::Contains("line 4: function 'foo' is not supported"));
  CHECK_THAT(parse_error("{% for x in xs recursive %}{% endfor %}"),
             Catch::Contains("recursive loops are not supported"));
  CHECK_THAT(parse_error("{{ '%s' % x }}"), Catch::Contains("printf-style formatting"));
  CHECK_THAT(parse_error("{% macro m() %}{{ varargs }}{% endmacro %}"),
             Catch::Contains("'varargs' is not supported"));
  CHECK_THAT(parse_error("{{ range(*xs) }}"), Catch::Contains("argument unpacking"));
  CHECK_THAT(parse_error("{{ xs | selectattr('a', 'sameas', 1) }}"),
             Catch::Contains("test 'sameas' is not supported"));
  CHECK_THAT(parse_error("{{ xs | map('wordcount') }}"),
             Catch::Contains("filter 'wordcount' is not supported"));
  CHECK_THAT(parse_error("{{ x | tojson(2) }}"), Catch::Contains("keyword arguments only"));
  CHECK_THAT(parse_error("{{ x[0](1) }}"), Catch::Contains("only functions, macros and methods"));
}

TEST_CASE("malformed templates are refused with their line, never a crash",
          "[models][chat_template]") {
  CHECK_THAT(parse_error("a\n{{ x "), Catch::Contains("line 2: tag '{{' is never closed"));
  CHECK_THAT(parse_error("a\n{% if x %}\nb"),
             Catch::Contains("line 2: 'if' tag is never closed (expected 'endif')"));
  CHECK_THAT(parse_error("{% for x in y %}{% if x %}{% endfor %}"),
             Catch::Contains("unexpected 'endfor' tag"));
  CHECK_THAT(parse_error("\n\n{% endfor %}"), Catch::Contains("line 3: unexpected 'endfor' tag"));
  CHECK_THAT(parse_error("{{ 1 + }}"), Catch::Contains("expected an expression, got '}}'"));
  CHECK_THAT(parse_error("\n{{ 'abc }}"),
             Catch::Contains("line 2: string literal is never closed"));
  CHECK_THAT(parse_error("{{ a $ b }}"), Catch::Contains("unexpected character '$'"));
  CHECK_THAT(parse_error("{{ }}"), Catch::Contains("expected an expression"));
  CHECK_THAT(parse_error("x\n{# comment"), Catch::Contains("line 2: comment '{#' is never closed"));
  CHECK_THAT(parse_error("{% else %}"), Catch::Contains("unexpected 'else' tag"));
  CHECK_THAT(parse_error("{% elif x %}"), Catch::Contains("unexpected 'elif' tag"));
  CHECK_THAT(parse_error("{% break %}"), Catch::Contains("'break' outside a loop"));
  CHECK_THAT(parse_error("{% for x in y %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}"),
             Catch::Contains("'break' outside a loop"));
  CHECK_THAT(parse_error("{% for x %}{% endfor %}"), Catch::Contains("expected 'in'"));
  CHECK_THAT(parse_error("{% set %}"), Catch::Contains("expected a name"));
  CHECK_THAT(parse_error("{% %}"), Catch::Contains("expected a tag name"));
  CHECK_THAT(parse_error("{{ (1, 2 }}"), Catch::Contains("expected ')'"));
  CHECK_THAT(parse_error("{{ x[] }}"), Catch::Contains("empty subscript"));
  CHECK_THAT(parse_error("{% macro m(a %}{% endmacro %}"), Catch::Contains("expected ','"));
  CHECK_THAT(parse_error("{{ 99999999999999999999 }}"), Catch::Contains("too large"));
  CHECK_THAT(parse_error("{{ 'x' 'y }}"), Catch::Contains("never closed"));
  CHECK_THAT(parse_error("{{ '\\x4' }}"), Catch::Contains("malformed"));
  CHECK_THAT(parse_error("{{ f(a=1, 2) }}"), Catch::Contains("positional argument follows"));
  CHECK_THAT(parse_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
             Catch::Contains("nested too deeply"));
  CHECK_THAT(parse_error("{{ " + std::string(5000, '-') + "1 }}"),
             Catch::Contains("nested too deeply"));
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if x %}";
  CHECK_THAT(parse_error(ifs), Catch::Contains("nested too deeply"));
  // Chains the parser builds in a loop are bounded too: evaluating or freeing them recurses.
  std::string sum = "1", attrs = "x", filters = "x";
  for (int i = 0; i < 100000; ++i) {
    sum += " + 1";
    attrs += ".a";
    filters += " | trim";
  }
  for (auto& e : {sum, attrs, filters})
    CHECK_THAT(parse_error("{{ " + e + " }}"), Catch::Contains("expression nested too deeply"));
}

TEST_CASE("templates that never end, nest values without bound or print exponentially are stopped",
          "[models][chat_template]") {
  CHECK_THAT(render_error("{% for i in range(100000) %}{% for j in range(100000) %}"
                          "{% set x = range(1000) %}{% endfor %}{% endfor %}"),
             Catch::Contains("does too much work"));
  CHECK_THAT(render_error("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
                          "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
             Catch::Contains("value nested too deeply"));
  CHECK_THAT(render_error("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}"
                          "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x | tojson }}"),
             Catch::Contains("too much work"));
  CHECK_THAT(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
             Catch::Contains("value nested too deeply"));
  CHECK_THAT(render_error("{{ 'ab' * 50000000 }}"), Catch::Contains("exceeds 64 MiB"));
  // Deep statements and expressions inside recursive macros: refused before the stack ends.
  std::string deep = "{% macro m(n) %}", cond = "1";
  for (int i = 0; i < 100; ++i) cond += " + 1";
  for (int i = 0; i < 150; ++i) deep += "{% if " + cond + " %}";
  deep += "{{ m(n + 1) }}";
  for (int i = 0; i < 150; ++i) deep += "{% endif %}";
  deep += "{% endmacro %}{{ m(0) }}";
  CHECK_THAT(render_error(deep), Catch::Contains("the template nests too deeply"));
  CHECK_THAT(render_error("{% set ns = namespace(s='x' * 40000000) %}{{ ns.s ~ ns.s }}"),
             Catch::Contains("exceeds 64 MiB"));
}

TEST_CASE("a context must be an object, and one template renders on many threads at once",
          "[models][chat_template]") {
  auto t = chat_template::parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  REQUIRE(t);
  auto refused = (*t)->render(ojson::array());
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_request));
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        ojson message = ojson::object();
        message["role"] = "user";
        message["content"] = std::to_string(k * 1000 + i);
        ojson ctx = ojson::object();
        ctx["messages"] = ojson::array({message});
        auto out = (*t)->render(ctx);
        if (!out || *out != "user:" + std::to_string(k * 1000 + i) + ";") ++wrong[k];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == std::vector<int>(4, 0));
}
