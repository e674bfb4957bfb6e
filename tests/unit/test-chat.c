/* SPDX-License-Identifier: MIT */
/* Chat templates: the Xing4 format (docs/model.md §7) from the built-in template and from the C renderer,
 * Jinja semantics a template author would notice, error messages with positions, and the render
 * budgets. Byte-exactness against python3-jinja2 on 58 real templates is the separate test
 * chat-templates-jinja-diff (tests/chat). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "chat/chat_xing4.h"
#include "common/json.h"
#include "common/log.h"

static struct json_value *ctx_from(const char *json) {
        struct json_value *v = NULL;
        assert_int_equal(json_parse(json, strlen(json), "test context", &v, NULL, 0), 0);
        return v;
}

/* Renders template text with a JSON context; returns the output (caller frees) or NULL with r set. */
static char *render(const char *tmpl, const char *json, int *r) {
        _cleanup_(chat_template_freep) struct chat_template *t = NULL;
        _cleanup_(json_freep) struct json_value *ctx = ctx_from(json ? json : "{}");
        char *out = NULL;
        log_clear_last_error();
        *r = chat_template_parse(tmpl, &t, NULL, 0);
        if (*r < 0)
                return NULL;
        *r = chat_template_render(t, ctx, &out, NULL, 0);
        return *r < 0 ? NULL : out;
}

static void assert_renders(const char *tmpl, const char *json, const char *expected) {
        int r;
        _cleanup_free_ char *out = render(tmpl, json, &r);
        if (r < 0)
                fail_msg("template %s failed: %s", tmpl, log_last_error());
        assert_string_equal(out, expected);
}

static void assert_fails(const char *tmpl, const char *json, int err, const char *message) {
        int r;
        _cleanup_free_ char *out = render(tmpl, json, &r);
        if (r >= 0)
                fail_msg("template %s rendered '%s', expected failure '%s'", tmpl, out, message);
        assert_int_equal(r, err);
        if (!strstr(log_last_error(), message))
                fail_msg("error '%s' does not contain '%s'", log_last_error(), message);
}

/* docs/model.md §7: the two rendered prompts, from the template and from the C renderer */
static const char *const TURN1_CTX =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}],"
        " \"add_generation_prompt\": true}";
static const char *const TURN1 = "<_system><_user>What is the capital of France?<_bot><think>\n";
static const char *const TURN2_CTX =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"},"
        " {\"role\": \"assistant\", \"content\": \"Paris.\", \"reasoning_content\": \"Easy.\"},"
        " {\"role\": \"user\", \"content\": \"And Japan?\"}], \"add_generation_prompt\": true}";
static const char *const TURN2 =
        "<_system><_user>What is the capital of France?<_bot></think>Paris.<_end>\n<_user>And Japan?<_bot><think>\n";

static void test_xing4_spec_examples(void **state) {
        (void) state;
        assert_renders(chat_xing4_template, TURN1_CTX, TURN1);
        assert_renders(chat_xing4_template, TURN2_CTX, TURN2);

        _cleanup_(json_freep) struct json_value *c1 = ctx_from(TURN1_CTX), *c2 = ctx_from(TURN2_CTX);
        _cleanup_free_ char *o1 = NULL, *o2 = NULL;
        assert_int_equal(chat_xing4_render(c1, &o1, NULL, 0), 0);
        assert_string_equal(o1, TURN1);
        assert_int_equal(chat_xing4_render(c2, &o2, NULL, 0), 0);
        assert_string_equal(o2, TURN2);

        /* thinking off: the generation prompt closes the think block */
        assert_renders(chat_xing4_template,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true,"
                       " \"enable_thinking\": false}",
                       "<_system><_user>Hi<_bot></think>");
}

/* Conversations on which the template (through the interpreter) and the C renderer must give the
 * same bytes, or both fail with the same message. */
static const char *const AGREE[] = {
        "{\"messages\": [], \"add_generation_prompt\": true}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"Hi\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
        " \"add_generation_prompt\": true}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Weather?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\":"
        " \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3, \"hourly\": false, \"x\": [1, 2.5, null],"
        " \"o\": {\"k\": \"\\u00e9\"}}}}, {\"function\": {\"name\": \"g\", \"arguments\": \"{\\\"a\\\": 1}\"}},"
        " {\"name\": \"bare\", \"arguments\": {}}]},"
        " {\"role\": \"tool\", \"content\": \"sunny\"}, {\"role\": \"tool\", \"content\": \"ok\"},"
        " {\"role\": \"assistant\", \"content\": \"Done.\"}, {\"role\": \"user\", \"content\": \"Thanks\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, {\"name\": \"g\"}],"
        " \"add_generation_prompt\": true, \"enable_thinking\": true}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"image\"},"
        " \"b\", {\"type\": \"text\", \"text\": \"c\"}]}, {\"role\": \"system\", \"content\": \"late\"}],"
        " \"add_generation_prompt\": 1, \"enable_thinking\": 0}",
        "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": []}],"
        " \"add_generation_prompt\": false}",
        "{\"messages\": [{\"role\": \"tool\", \"content\": \"first\"}, {\"role\": \"user\", \"content\": \"u\"},"
        " {\"role\": \"tool\", \"content\": null}]}",
        /* errors: both must refuse with the same text */
        "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
};

static void test_xing4_c_renderer_agrees(void **state) {
        (void) state;
        _cleanup_(chat_template_freep) struct chat_template *t = NULL;
        assert_int_equal(chat_template_parse(chat_xing4_template, &t, NULL, 0), 0);
        for (size_t i = 0; i < ELEMENTSOF(AGREE); i++) {
                _cleanup_(json_freep) struct json_value *ctx = ctx_from(AGREE[i]);
                _cleanup_free_ char *a = NULL, *b = NULL;
                char ea[512] = "", eb[512] = "";
                int ra = chat_template_render(t, ctx, &a, ea, sizeof ea);
                int rb = chat_xing4_render(ctx, &b, eb, sizeof eb);
                if ((ra < 0) != (rb < 0))
                        fail_msg("context %zu: template r=%d (%s), C renderer r=%d (%s)", i, ra, ea, rb, eb);
                if (ra < 0) {
                        /* the template's message is "template:L:C: raise_exception: TEXT" */
                        assert_non_null(strstr(ea, eb));
                        assert_true(strlen(eb) > 10);
                        continue;
                }
                if (!streq(a, b))
                        fail_msg("context %zu differs:\ntemplate: %s\nC:        %s", i, a, b);
        }
        /* the tool call forms written out, so a change in one renderer is visible here */
        _cleanup_(json_freep) struct json_value *ctx = ctx_from(AGREE[3]);
        _cleanup_free_ char *out = NULL;
        assert_int_equal(chat_xing4_render(ctx, &out, NULL, 0), 0);
        assert_non_null(strstr(out, "<_bot></think><tool_call>get_weather<param_key>city</param_key><param_value>Paris"
                                    "</param_value><param_key>days</param_key><param_value>3</param_value><param_key>hourly"
                                    "</param_key><param_value>false</param_value><param_key>x</param_key><param_value>"
                                    "[1, 2.5, null]</param_value><param_key>o</param_key><param_value>{\"k\": \"\xc3\xa9\"}"
                                    "</param_value></tool_call><tool_call>{\"name\": \"g\", \"arguments\": {\"a\": 1}}"
                                    "</tool_call><tool_call>bare</tool_call><_end>\n"
                                    "<_user><tool_response>sunny</tool_response><tool_response>ok</tool_response>"
                                    "<_bot></think>Done.<_end>\n<_user>Thanks<_bot><think>\n"));
        assert_true(strncmp(out, "<_system>S\n\n# Tools\n\n", 21) == 0);
}

/* tests/chat/xing4.jinja is what the differential test renders with python3-jinja2 */
static void test_xing4_template_file_matches(void **state) {
        (void) state;
        const char *src = getenv("X4_SOURCE_DIR");
        char path[4096];
        snprintf(path, sizeof(path), "%s/tests/chat/xing4.jinja", src ? src : X4_FIXTURES "/../..");
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        assert_string_equal(buf, chat_xing4_template);
}

static void test_expressions(void **state) {
        (void) state;
        /* Python printing */
        assert_renders("{{ 1.0 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }}",
                       NULL, "1.0 1e+16 0.30000000000000004 1e-05 1.5 3 -4 2");
        assert_renders("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ ('a',) }} {{ [\"it's\"] }} {{ none }}", NULL,
                       "[1, 'a', None, True, 1.5, {'k': 'v'}] ('a',) [\"it's\"] None");
        /* strings: slices by code point, methods, concatenation */
        assert_renders("{{ 'h\xc3\xa9llo'[::-1] }}|{{ 'abc'[1:] }}|{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|"
                       "{{ 'x' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ 'Hello World'.lower().startswith('hello') }}",
                       NULL, "oll\xc3\xa9h|bc|a b|['a', 'b', '', 'c']|x1None|ababab|True");
        /* and/or return operands; conditional without else is undefined (prints nothing) */
        assert_renders("{{ 0 or 'd' }}|{{ 'a' and 'b' }}|{{ 'x' if false }}|{{ 2 in [1, 2] }}|{{ 'b' not in 'abc' }}", NULL,
                       "d|b||True|False");
        /* filters */
        assert_renders("{{ {'b': 1, 'a': [1, 2]} | tojson }}|{{ [1, 2] | tojson(indent=2) }}|{{ '\xc3\xa9' | tojson }}|"
                       "{{ [3, 1, 2] | sort | join('-') }}|{{ 'x' | default('y') }}{{ nope | default('y') }}|"
                       "{{ '  t  ' | trim | upper }}|{{ 'abc' | length }}|{{ {'a': 1} | items | list }}",
                       NULL,
                       "{\"b\": 1, \"a\": [1, 2]}|[\n  1,\n  2\n]|\"\xc3\xa9\"|1-2-3|xy|T|3|[('a', 1)]");
        assert_renders("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", \"content\": \"b\"},"
                       " {\"role\": \"user\", \"content\": \"c\"}]}",
                       "a,c");
        /* tests */
        assert_renders("{{ x is defined }}{{ y is none }}{{ 'a' is string }}{{ {} is mapping }}{{ 3 is odd }}"
                       "{{ 4 is divisibleby 2 }}{{ u is iterable }}",
                       "{\"x\": 1, \"y\": null}", "TrueTrueTrueTrueTrueTrueTrue");
}

static void test_statements(void **state) {
        (void) state;
        /* loop variables, filtered loops, else, unpacking, break/continue */
        assert_renders("{% for a in [1, 2, 3] %}{{ loop.index }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.revindex }}"
                       "{{ 'L' if loop.last }}|{% endfor %}",
                       NULL, "123|2132|321L|");
        assert_renders("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"
                       "{% for x in [] %}no{% else %}empty{% endfor %}"
                       "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"
                       "{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i > 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
                       NULL, "2/2 4/2 emptya=1;b=2;023");
        /* scoping: a set inside a loop does not leak; namespace attributes do */
        assert_renders("{% set x = 0 %}{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{{ x }}{% set x = i %}"
                       "{% set ns.n = ns.n + i %}{% endfor %}{{ x }}{{ ns.n }}",
                       NULL, "0003");
        /* macros with defaults and keywords; block set; filter block */
        assert_renders("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{% set c = 5 %}{{ m(1) }}{{ m(1, b=3) }}"
                       "{% set blk %} B {% endset %}[{{ blk }}]{% filter upper %}up{% endfilter %}",
                       NULL, "125135[ B ]UP");
        /* whitespace: trim_blocks + lstrip_blocks, '-' and '+' modifiers, comments, trailing newline dropped */
        assert_renders("  {% if true %}\n  x\n  {% endif %}\n  {# c #}\ny\n{{ 'z' }}\n  {%+ if true %}q{% endif %}  {{- ' w' -}}  \n\n",
                       NULL, "  x\ny\nz\n  q w");
        assert_renders("{{ strftime_now('%Y-%m-%d') }}", NULL, "2026-01-02");
        /* a generation block (transformers' assistant mask) renders its body */
        assert_renders("{% generation %}G{% endgeneration %}", NULL, "G");
}

static void test_errors(void **state) {
        (void) state;
        log_set_max_level(LOG_CRIT);
        /* parse errors name the place */
        assert_fails("a\nb {% foo %}", NULL, -EINVAL, "template:2:6: unknown tag 'foo'");
        assert_fails("{% if x %}never closed", NULL, -EINVAL, "unexpected end of template, expected 'endif'");
        assert_fails("{% for x in y %}{% endif %}", NULL, -EINVAL, "template:1:20: unexpected 'endif', expected 'else'");
        assert_fails("{{ 1 + }}", NULL, -EINVAL, "template:1:8: unexpected '}}' in expression");
        assert_fails("x {{ 'abc }}", NULL, -EINVAL, "template:1:6: unterminated string literal");
        assert_fails("{% call m() %}{% endcall %}", NULL, -EINVAL, "template:1:4: unsupported tag 'call'");
        assert_fails("{% for x in y recursive %}{% endfor %}", NULL, -EINVAL, "unsupported construct: recursive for loop");
        char deep[1024] = "{{ ";
        for (int i = 0; i < 300; i++)
                strcat(deep, "(");
        strcat(deep, "1");
        for (int i = 0; i < 300; i++)
                strcat(deep, ")");
        strcat(deep, " }}");
        assert_fails(deep, NULL, -EINVAL, "nested deeper than 200 levels");
        /* render errors: undefined access, unknown/unsupported filters (reached), raise_exception */
        assert_fails("{{ messages[0].content.x.y }}", "{\"messages\": [{\"role\": \"user\"}]}", -EINVAL,
                     "template:1:23: 'content' is undefined (while reading its attribute 'x')");
        assert_fails("ok {{ x | from_json }}", "{\"x\": \"{}\"}", -EINVAL, "template:1:11: no filter named 'from_json'");
        assert_fails("\n{{ x | xmlattr }}", NULL, -EINVAL, "template:2:8: unsupported filter 'xmlattr'");
        assert_fails("{{ raise_exception('System role not supported') }}", NULL, -EINVAL,
                     "raise_exception: System role not supported");
        assert_fails("{{ 'a' + 1 }}", NULL, -EINVAL, "unsupported operand type(s) for +: 'str' and 'int'");
        assert_fails("{{ x.append(1) }}", "{\"x\": []}", -EINVAL, "access to attribute 'append' of 'list' object is unsafe");
        assert_fails("{{ [1] | map('upper') | tojson }}", NULL, -EINVAL, "Object of type generator is not JSON serializable");
        /* a namespace that holds itself prints as Python prints it, not by recursing without end */
        assert_renders("{%- set ns = namespace(a=1, b=[1, 2]) -%}{%- set ns.a = ns -%}{{ ns.a }}|{{ ns == ns.a }}",
                       NULL, "<Namespace {'a': <Namespace {...}>, 'b': [1, 2]}>|True");
        assert_renders("{%- set ns = namespace(l=[]) -%}{%- set ns.l = [ns, {'n': ns}] -%}{{ ns.l }}", NULL,
                       "[<Namespace {'l': [...]}>, {'n': <Namespace {'l': [...]}>}]");
        assert_fails("{%- set ns = namespace() -%}{%- set ns.a = [ns] -%}{{ ns.a|tojson }}", NULL, -EINVAL,
                     "Object of type Namespace is not JSON serializable");
        /* values as deep as a request's JSON may be print and compare; deeper ones are an error */
        {
                char *json = malloc(2 * JSON_DEPTH_MAX + 16);
                assert_non_null(json);
                strcpy(json, "{\"x\": ");
                for (int i = 0; i < JSON_DEPTH_MAX - 1; i++)
                        strcat(json, "[");
                for (int i = 0; i < JSON_DEPTH_MAX - 1; i++)
                        strcat(json, "]");
                strcat(json, "}");
                assert_renders("{{ (x|string)|length }} {{ x == x[0:] }}", json, "510 True");
                free(json);
                assert_fails("{% set ns = namespace(v=1) %}{% for i in range(600) %}{% set ns.v = [ns.v] %}{% endfor %}"
                             "{{ ns.v }}",
                             NULL, -EINVAL, "printing a value nested more than 512 deep");
                assert_fails("{% set ns = namespace(v=1, w=1) %}{% for i in range(600) %}{% set ns.v = [ns.v] %}"
                             "{% set ns.w = [ns.w] %}{% endfor %}{{ ns.v == ns.w }}",
                             NULL, -EINVAL, "comparing values nested more than 512 deep");
        }
        /* not silently skipped: an unrendered unknown filter is fine, as in Jinja2 3.x */
        assert_renders("{% if false %}{{ x | from_json }}{% endif %}ok", NULL, "ok");
        log_set_max_level(LOG_INFO);
}

static void test_limits(void **state) {
        (void) state;
        log_set_max_level(LOG_CRIT);
        assert_fails("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, -E2BIG,
                     "template render exceeded 10000000 operations");
        assert_fails("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", NULL,
                     -E2BIG, "template render exceeded");
        assert_fails("{{ 'x' * 20000000 }}", NULL, -E2BIG, "exceeded the output limit of 16777216 bytes");
        assert_fails("{% for i in range(5000) %}{{ 'y' * 5000 }}{% endfor %}", NULL, -E2BIG,
                     "exceeded the output limit of 16777216 bytes");
        assert_fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, -E2BIG,
                     "exceeded the macro call depth of 100");

        /* deep statement nesting compounded by recursion is bounded too (C stack) */
        static char nest[8192];
        strcpy(nest, "{% macro f(n) %}");
        for (int i = 0; i < 150; i++)
                strcat(nest, "{% if true %}");
        strcat(nest, "{{ f(n + 1) }}");
        for (int i = 0; i < 150; i++)
                strcat(nest, "{% endif %}");
        strcat(nest, "{% endmacro %}{{ f(0) }}");
        assert_fails(nest, NULL, -E2BIG, "template render exceeded the nesting depth of 3000");

        /* limits are settable per template */
        _cleanup_(chat_template_freep) struct chat_template *t = NULL;
        const char *src = "{% for i in range(50) %}{{ i }}{% endfor %}";
        assert_int_equal(chat_template_parse(src, &t, NULL, 0), 0);
        chat_template_set_limits(t, &(struct chat_limits) {.max_output = 20});
        char *out = NULL;
        assert_int_equal(chat_template_render(t, NULL, &out, NULL, 0), -E2BIG);
        assert_non_null(strstr(log_last_error(), "output limit of 20 bytes"));
        log_set_max_level(LOG_INFO);
}

static void test_context_build(void **state) {
        (void) state;
        _cleanup_(json_freep) struct json_value *msgs = ctx_from(
                "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\":"
                " [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}},"
                " {\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"not json\"}}]}]");
        _cleanup_(json_freep) struct json_value *tools = ctx_from("[]");
        _cleanup_(json_freep) struct json_value *ctx = NULL;
        assert_int_equal(chat_context_build(msgs, tools, true, 0, "<s>", NULL, &ctx, NULL, 0), 0);
        _cleanup_free_ char *dump = json_dump(ctx, JSON_COMPACT, 0);
        assert_string_equal(dump, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"\","
                                  "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"q\":\"x\"}}},"
                                  "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]}],"
                                  "\"add_generation_prompt\":true,\"enable_thinking\":false,\"bos_token\":\"<s>\"}");
        _cleanup_free_ char *out = NULL;
        assert_int_equal(chat_xing4_render(ctx, &out, NULL, 0), 0);
        assert_string_equal(out, "<_system><_user>hi<_bot></think><tool_call>f<param_key>q</param_key><param_value>x"
                                 "</param_value></tool_call><tool_call>{\"name\": \"g\", \"arguments\": not json}</tool_call>"
                                 "<_end>\n<_bot></think>");

        log_set_max_level(LOG_CRIT);
        _cleanup_(json_freep) struct json_value *bad = ctx_from("[{\"role\": \"robot\", \"content\": \"x\"}]");
        _cleanup_(json_freep) struct json_value *ctx2 = NULL;
        assert_int_equal(chat_context_build(bad, NULL, true, -1, NULL, NULL, &ctx2, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "messages[0].role: system, user, assistant or tool expected, got 'robot'");
        char err[128] = "";
        assert_int_equal(chat_context_build(bad, NULL, true, -1, NULL, NULL, &ctx2, err, sizeof err), -EINVAL);
        assert_string_equal(err, "messages[0].role: system, user, assistant or tool expected, got 'robot'");
        log_set_max_level(LOG_INFO);
}

int main(void) {
        setenv("X4_TEMPLATE_NOW", "2026-01-02", 1);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_xing4_spec_examples),
                cmocka_unit_test(test_xing4_c_renderer_agrees),
                cmocka_unit_test(test_xing4_template_file_matches),
                cmocka_unit_test(test_expressions),
                cmocka_unit_test(test_statements),
                cmocka_unit_test(test_errors),
                cmocka_unit_test(test_limits),
                cmocka_unit_test(test_context_build),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
