/* SPDX-License-Identifier: MIT */
/* Output channel parser: every rule of outparse.h, fed the way the scheduler feeds it (ids from
 * the fixture tokenizer, text from the streaming detokenizer), plus hand-split token texts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chat/outparse.h"
#include "chat/tokenizer.h"
#include "common/json.h"
#include "common/log.h"

static struct tokenizer *tok;

static int setup(void **state) {
        const char *src = getenv("X4_SOURCE_DIR");
        char *p = NULL;
        log_set_max_level(LOG_CRIT);
        if (src)
                assert_true(asprintf(&p, "%s/tests/tokenizer/spm-bpe8k.gguf", src) > 0);
        else
                assert_true(asprintf(&p, "%s/../tokenizer/spm-bpe8k.gguf", X4_FIXTURES) > 0);
        int r = tokenizer_load(p, &tok);
        free(p);
        return r;
}

static int teardown(void **state) {
        tokenizer_free(tok);
        return 0;
}

#define ID_END 2
#define ID_USER 4
#define ID_THINK 9
#define ID_END_THINK 10
#define ID_TOOL_CALL 11
#define ID_END_TOOL_CALL 12
#define ID_TOOL_RESPONSE 13
#define ID_TEXT 303 /* any normal piece: the parser uses the text it is given */

struct seen {
        char reasoning[4096], content[4096];
        size_t n_calls;
        char names[8][64], args[8][512];
        int n_events, n_stops;
        char order[64]; /* r c T S per event */
        char reason[32];
        int32_t stop_id;
        char stop_string[64];
};

static int collect(const struct outparse_event *ev, void *userdata) {
        struct seen *s = userdata;
        char kind = '?';
        switch (ev->type) {
        case OUTPARSE_EVENT_TEXT:
                assert_true(ev->len > 0);
                assert_true(ev->channel == OUTPARSE_REASONING || ev->channel == OUTPARSE_CONTENT);
                strncat(ev->channel == OUTPARSE_REASONING ? s->reasoning : s->content, ev->text, ev->len);
                kind = ev->channel == OUTPARSE_REASONING ? 'r' : 'c';
                break;
        case OUTPARSE_EVENT_TOOL_CALL:
                assert_true(s->n_calls < 8);
                snprintf(s->names[s->n_calls], 64, "%s", ev->tool_name);
                snprintf(s->args[s->n_calls], 512, "%s", ev->tool_arguments);
                s->n_calls++;
                kind = 'T';
                break;
        case OUTPARSE_EVENT_STOP:
                s->n_stops++;
                snprintf(s->reason, sizeof(s->reason), "%s", ev->finish_reason);
                s->stop_id = ev->stop_id;
                snprintf(s->stop_string, sizeof(s->stop_string), "%s", ev->stop_string ? ev->stop_string : "");
                kind = 'S';
                break;
        }
        size_t l = strlen(s->order);
        /* consecutive text events of one channel count as one in `order` */
        if (!(l > 0 && s->order[l - 1] == kind && (kind == 'r' || kind == 'c')) && l + 1 < sizeof(s->order)) {
                s->order[l] = kind;
                s->order[l + 1] = 0;
        }
        s->n_events++;
        return 0;
}

static struct outparse *new_parser(struct seen *s, bool thinking, int64_t budget, const char *const *stops,
                                   size_t n_stops, const int32_t *stop_ids, size_t n_ids) {
        struct outparse *p = NULL;
        memset(s, 0, sizeof(*s));
        struct outparse_config c = { .thinking = thinking, .thinking_budget = budget, .stop_strings = stops,
                                     .n_stop_strings = n_stops, .stop_ids = stop_ids, .n_stop_ids = n_ids,
                                     .emit = collect, .userdata = s };
        assert_int_equal(outparse_new(tok, &c, &p, NULL, 0), 0);
        return p;
}

/* A parser for a chat request that offered the tools f and get_weather. */
static struct outparse *new_tool_parser(struct seen *s) {
        static const char *const names[] = { "f", "get_weather" };
        struct outparse *p = NULL;
        memset(s, 0, sizeof(*s));
        struct outparse_config c = { .tool_names = names, .n_tool_names = 2, .emit = collect, .userdata = s };
        assert_int_equal(outparse_new(tok, &c, &p, NULL, 0), 0);
        return p;
}

/* What the model would generate for this text: the tokenizer's ids, each with the streaming
 * detokenizer's text (many tokens, split wherever BPE split it). */
static void feed_model_text(struct outparse *p, const char *text) {
        _cleanup_free_ int32_t *ids = NULL;
        _cleanup_(tokenizer_stream_freep) struct tokenizer_stream *st = NULL;
        size_t n;
        assert_int_equal(tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, NULL, 0), 0);
        assert_int_equal(tokenizer_stream_new(tok, 0, &st), 0);
        for (size_t i = 0; i < n; i++) {
                const char *t;
                size_t l;
                assert_int_equal(tokenizer_stream_feed(st, ids[i], &t, &l), 0);
                assert_int_equal(outparse_feed(p, ids[i], t, l), 0);
        }
}

static void feed(struct outparse *p, int32_t id, const char *text) {
        assert_int_equal(outparse_feed(p, id, text, text ? strlen(text) : 0), 0);
}

/* one token per byte: the most split a call can be */
static void feed_bytes(struct outparse *p, const char *text) {
        for (const char *c = text; *c; c++)
                assert_int_equal(outparse_feed(p, ID_TEXT, c, 1), 0);
}

static void test_thinking(void **state) {
        struct seen s;
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, true, -1, NULL, 0, NULL, 0);

        assert_int_equal(outparse_channel(p), OUTPARSE_REASONING);
        feed(p, ID_TEXT, "Let me think.");
        feed(p, ID_TEXT, "\n");
        /* the "\n" may be the structural one: not emitted yet */
        assert_string_equal(s.reasoning, "Let me think.");
        feed(p, ID_TEXT, "More.\n\n");
        assert_string_equal(s.reasoning, "Let me think.\nMore.\n");
        feed(p, ID_END_THINK, "</think>");
        assert_int_equal(outparse_channel(p), OUTPARSE_CONTENT);
        feed_model_text(p, "Paris.<_end>");
        assert_string_equal(s.reasoning, "Let me think.\nMore.\n"); /* one "\n" dropped, not two */
        assert_string_equal(s.content, "Paris.");
        assert_string_equal(s.order, "rcS");
        assert_string_equal(s.reason, "stop");
        assert_int_equal(s.stop_id, ID_END);
        assert_true(outparse_stopped(p));
        /* after the stop nothing more comes out */
        feed(p, ID_TEXT, "ignored");
        assert_int_equal(outparse_finish(p, "length"), 0);
        assert_string_equal(s.content, "Paris.");
        assert_int_equal(s.n_stops, 1);
}

static void test_thinking_off(void **state) {
        struct seen s;
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        assert_int_equal(outparse_channel(p), OUTPARSE_CONTENT);
        feed_model_text(p, "Hello there.\n</think>x<_end>");
        assert_string_equal(s.reasoning, "");
        assert_string_equal(s.content, "Hello there.\nx"); /* a stray </think> in content is dropped */
        assert_string_equal(s.order, "cS");

        /* <think> as the very first token opens reasoning even with thinking off */
        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed_model_text(q, "<think>hmm\n</think>ok<_end>");
        assert_string_equal(s.reasoning, "hmm");
        assert_string_equal(s.content, "ok");
}

static void test_end_think_missing(void **state) {
        struct seen s;
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        feed_model_text(p, "still thinking\n");
        assert_string_equal(s.reasoning, "still thinking");
        assert_int_equal(outparse_finish(p, "length"), 0);
        /* no </think>: the held "\n" was reasoning text after all */
        assert_string_equal(s.reasoning, "still thinking\n");
        assert_string_equal(s.content, "");
        assert_string_equal(s.reason, "length");
        assert_int_equal(s.stop_id, -1);

        /* the detokenizer's flush at the end (an unfinished character) is still reasoning */
        _cleanup_(outparse_freep) struct outparse *f = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        feed(f, ID_TEXT, "x");
        assert_int_equal(outparse_feed_text(f, "\xef\xbf\xbd", 3), 0);
        assert_int_equal(outparse_reasoning_tokens(f), 1);
        assert_int_equal(outparse_finish(f, "length"), 0);
        assert_string_equal(s.reasoning, "x\xef\xbf\xbd");
        assert_int_equal(outparse_feed_text(f, "y", 1), 0); /* after the stop: ignored */
        assert_string_equal(s.reasoning, "x\xef\xbf\xbd");

        /* and ended by <_end> inside reasoning: everything is reasoning */
        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        feed_model_text(q, "a\n<_end>");
        assert_string_equal(s.reasoning, "a\n");
        assert_string_equal(s.order, "rS");
}

static void test_thinking_budget(void **state) {
        struct seen s;
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, true, 0, NULL, 0, NULL, 0);
        /* budget 0: before the first token the caller must force </think> */
        assert_true(outparse_should_force_end_think(p));
        assert_int_equal(outparse_end_think_id(p), ID_END_THINK);
        feed(p, outparse_end_think_id(p), "</think>");
        assert_false(outparse_should_force_end_think(p));
        feed_model_text(p, "Answer<_end>");
        assert_string_equal(s.reasoning, "");
        assert_string_equal(s.content, "Answer");

        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, true, 3, NULL, 0, NULL, 0);
        feed(q, ID_TEXT, "one");
        feed(q, ID_TEXT, " two");
        assert_false(outparse_should_force_end_think(q));
        feed(q, ID_TEXT, "\n");
        assert_true(outparse_should_force_end_think(q));
        assert_int_equal(outparse_reasoning_tokens(q), 3);
        feed(q, ID_END_THINK, "</think>");
        feed(q, ID_TEXT, "done");
        assert_string_equal(s.reasoning, "one two");
        assert_string_equal(s.content, "done");

        /* no budget: never forced */
        _cleanup_(outparse_freep) struct outparse *r = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        for (int i = 0; i < 100; i++)
                feed(r, ID_TEXT, "x");
        assert_false(outparse_should_force_end_think(r));
        /* thinking off: nothing to force */
        _cleanup_(outparse_freep) struct outparse *t = new_parser(&s, false, 0, NULL, 0, NULL, 0);
        assert_false(outparse_should_force_end_think(t));
}

static void test_tool_call_params(void **state) {
        static const char *call =
                "get_weather<param_key>city</param_key><param_value>Paris</param_value>\n"
                "<param_key>days</param_key><param_value>3</param_value>"
                "<param_key>opts</param_key><param_value>{\"unit\": \"C\", \"alerts\": [true, null]}</param_value>"
                "<param_key>quoted</param_key><param_value>\"hi\"</param_value>"
                "<param_key>when</param_key><param_value>tomorrow at 3</param_value>"
                "<param_key>ratio</param_key><param_value>-2.5e3</param_value>";
        static const char *want =
                "{\"city\": \"Paris\", \"days\": 3, \"opts\": {\"unit\": \"C\", \"alerts\": [true, null]}, "
                "\"quoted\": \"\\\"hi\\\"\", \"when\": \"tomorrow at 3\", \"ratio\": -2500.0}";
        struct seen s;

        /* as the model would split it */
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed_model_text(p, "Checking.");
        feed(p, ID_TOOL_CALL, "<tool_call>");
        assert_int_equal(outparse_channel(p), OUTPARSE_TOOL_CALL);
        feed_model_text(p, call);
        assert_int_equal(s.n_calls, 0);
        feed(p, ID_END_TOOL_CALL, "</tool_call>");
        feed(p, ID_END, "<_end>");
        assert_string_equal(s.content, "Checking.");
        assert_int_equal(s.n_calls, 1);
        assert_string_equal(s.names[0], "get_weather");
        assert_string_equal(s.args[0], want);
        assert_string_equal(s.order, "cTS");

        /* one byte per token */
        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed(q, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(q, call);
        feed(q, ID_END_TOOL_CALL, "</tool_call>");
        assert_int_equal(s.n_calls, 1);
        assert_string_equal(s.args[0], want);
        assert_string_equal(s.content, "");
}

static void test_tool_call_json_back_to_back(void **state) {
        struct seen s;
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        feed_model_text(p, "plan\n</think>"
                           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"x y\"}}</tool_call>\n"
                           "<tool_call>g<param_key>flag</param_key><param_value>true</param_value></tool_call>"
                           "<tool_call>{\"name\":\"h\",\"arguments\":\"{\\\"k\\\": [1, 2]}\"}</tool_call>"
                           "<tool_call>{\"name\": \"noargs\"}</tool_call><_end>");
        assert_string_equal(s.reasoning, "plan");
        assert_int_equal(s.n_calls, 4);
        assert_string_equal(s.names[0], "f");
        assert_string_equal(s.args[0], "{\"a\": 1, \"b\": \"x y\"}");
        assert_string_equal(s.names[1], "g");
        assert_string_equal(s.args[1], "{\"flag\": true}");
        assert_string_equal(s.names[2], "h");
        assert_string_equal(s.args[2], "{\"k\": [1, 2]}");
        assert_string_equal(s.names[3], "noargs");
        assert_string_equal(s.args[3], "{}");
        assert_string_equal(s.content, "\n"); /* the text between calls is content */
        assert_string_equal(s.order, "rTcTTTS");
}

static void test_tool_call_malformed(void **state) {
        static const char *bad[] = {
                "not a name<param_key>k</param_key>oops",          /* value missing */
                "f<param_key>k</param_key><param_value>v",          /* value not closed */
                "{\"name\": 3}",                                     /* name not a string */
                "{\"name\": \"f\", \"arguments\": [1]}",             /* arguments not an object */
                "{\"name\": \"f\", \"arguments\": {\"a\": }}",       /* not JSON */
                "",                                                  /* empty */
                "f<param_key>k</param_key><param_value>v</param_value> trailing",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                struct seen s;
                char want[512];
                _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, false, -1, NULL, 0, NULL, 0);
                feed(p, ID_TOOL_CALL, "<tool_call>");
                feed_bytes(p, bad[i]);
                feed(p, ID_END_TOOL_CALL, "</tool_call>");
                feed(p, ID_END, "<_end>");
                snprintf(want, sizeof(want), "<tool_call>%s</tool_call>", bad[i]);
                assert_int_equal(s.n_calls, 0);
                assert_string_equal(s.content, want);
                assert_string_equal(s.reason, "stop");
        }

        struct seen s;
        /* the output budget ran out inside a call of a request that offered tools: the unfinished
         * call is dropped, not shown as content (an API client would show the call syntax and
         * send it back in its history) */
        _cleanup_(outparse_freep) struct outparse *p = new_tool_parser(&s);
        feed_model_text(p, "Let me check.");
        feed(p, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(p, "{\"name\": \"f\", \"argu");
        assert_int_equal(outparse_finish(p, "length"), 0);
        assert_string_equal(s.content, "Let me check.");
        assert_int_equal(s.n_calls, 0);
        assert_string_equal(s.reason, "length");
        /* cut there in the parameter form, too */
        _cleanup_(outparse_freep) struct outparse *p2 = new_tool_parser(&s);
        feed(p2, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(p2, "get_weather<param_key>city</param_key><param_value>Par");
        assert_int_equal(outparse_finish(p2, "length"), 0);
        assert_string_equal(s.content, "");
        /* but a call whose JSON is complete is still one */
        _cleanup_(outparse_freep) struct outparse *p3 = new_tool_parser(&s);
        feed(p3, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(p3, "{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
        assert_int_equal(outparse_finish(p3, "length"), 0);
        assert_int_equal(s.n_calls, 1);
        assert_string_equal(s.reason, "length");
        /* unterminated at the end of output for another reason (cancelled): content */
        _cleanup_(outparse_freep) struct outparse *p4 = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed(p4, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(p4, "{\"name\": \"f\", \"argu");
        assert_int_equal(outparse_finish(p4, "cancelled"), 0);
        assert_string_equal(s.content, "<tool_call>{\"name\": \"f\", \"argu");
        /* raw text (no tools offered: a completion, x4ctl --raw): the text is the answer */
        _cleanup_(outparse_freep) struct outparse *p5 = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed(p5, ID_TOOL_CALL, "<tool_call>");
        feed_bytes(p5, "{\"name\": \"f\", \"argu");
        assert_int_equal(outparse_finish(p5, "length"), 0);
        assert_string_equal(s.content, "<tool_call>{\"name\": \"f\", \"argu");

        /* unterminated but complete when the turn ends: still a call */
        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed_model_text(q, "<tool_call>{\"name\": \"f\", \"arguments\": {}}<_end>");
        assert_int_equal(s.n_calls, 1);
        assert_string_equal(s.order, "TS");

        /* a second <tool_call> before the first closed; a stray </tool_call> */
        _cleanup_(outparse_freep) struct outparse *r = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed_model_text(r, "<tool_call>broken<tool_call>{\"name\": \"ok\"}</tool_call></tool_call>");
        assert_int_equal(s.n_calls, 1);
        assert_string_equal(s.names[0], "ok");
        assert_string_equal(s.content, "<tool_call>broken</tool_call>");

        /* in reasoning a tool call is just text */
        _cleanup_(outparse_freep) struct outparse *u = new_parser(&s, true, -1, NULL, 0, NULL, 0);
        feed_model_text(u, "<tool_call>{\"name\": \"f\"}</tool_call>");
        assert_int_equal(s.n_calls, 0);
        assert_string_equal(s.reasoning, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

/* A chat request's offered tools (tool_names): a call of another name is content text, as a
 * malformed one is; none offered (no_tool_calls): every <tool_call> is text. */
static void test_tool_call_offered_names(void **state) {
        static const char *const offered[] = { "get_weather", "run_shell" };
        const char *text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"
                           "<tool_call>made_up<param_key>q</param_key><param_value>x</param_value></tool_call>"
                           "<tool_call>run_shell<param_key>command</param_key><param_value>ls</param_value></tool_call><_end>";
        struct seen s;
        struct outparse *p = NULL;

        memset(&s, 0, sizeof s);
        struct outparse_config c = { .tool_names = offered, .n_tool_names = 2, .emit = collect, .userdata = &s };
        assert_int_equal(outparse_new(tok, &c, &p, NULL, 0), 0);
        feed_model_text(p, text);
        assert_int_equal(s.n_calls, 2);
        assert_string_equal(s.names[0], "get_weather");
        assert_string_equal(s.args[0], "{\"city\": \"Oslo\"}");
        assert_string_equal(s.names[1], "run_shell");
        assert_string_equal(s.content,
                            "<tool_call>made_up<param_key>q</param_key><param_value>x</param_value></tool_call>");
        assert_string_equal(s.order, "TcTS");
        outparse_free(p);

        memset(&s, 0, sizeof s);
        struct outparse_config none = { .no_tool_calls = true, .emit = collect, .userdata = &s };
        assert_int_equal(outparse_new(tok, &none, &p, NULL, 0), 0);
        feed_model_text(p, text);
        assert_int_equal(s.n_calls, 0);
        assert_int_equal(s.n_stops, 1);
        assert_non_null(strstr(s.content, "get_weather"));
        assert_non_null(strstr(s.content, "made_up"));
        outparse_free(p);
}

/* A native call's values are typed by the tool's parameters schema (tool_parameters): a raw
 * string that reads as JSON stays a string where the schema wants a string; other values take the
 * JSON type the schema allows; a tool without a schema, or a key it does not list, types any JSON. */
static void test_tool_call_typed_by_schema(void **state) {
        static const char *const names[] = { "get_weather", "free" };
        const char *schema = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                             "\"days\":{\"type\":\"integer\"},\"code\":{\"enum\":[\"1\",\"2\"]},"
                             "\"note\":{\"type\":[\"string\",\"null\"]},\"at\":{\"$ref\":\"#/$defs/pt\"},"
                             "\"any\":{}},\"$defs\":{\"pt\":{\"type\":\"object\"}}}";
        struct json_value *params = NULL;
        assert_int_equal(json_parse(schema, strlen(schema), "schema", &params, NULL, 0), 0);
        const struct json_value *tp[2] = { params, NULL };
        struct seen s;
        struct outparse *p = NULL;

        memset(&s, 0, sizeof s);
        struct outparse_config c = { .tool_names = names, .n_tool_names = 2, .tool_parameters = tp,
                                     .emit = collect, .userdata = &s };
        assert_int_equal(outparse_new(tok, &c, &p, NULL, 0), 0);
        json_free(params); /* the parser keeps its own copy */
        feed_model_text(p, "<tool_call>get_weather<param_key>city</param_key><param_value>42</param_value>"
                           "<param_key>days</param_key><param_value>3</param_value>"
                           "<param_key>code</param_key><param_value>1</param_value>"
                           "<param_key>note</param_key><param_value>null</param_value>"
                           "<param_key>at</param_key><param_value>{\"x\": 1}</param_value>"
                           "<param_key>any</param_key><param_value>true</param_value>"
                           "<param_key>extra</param_key><param_value>[1]</param_value></tool_call>"
                           "<tool_call>free<param_key>n</param_key><param_value>7</param_value></tool_call><_end>");
        assert_int_equal(s.n_calls, 2);
        assert_string_equal(s.names[0], "get_weather");
        assert_string_equal(s.args[0], "{\"city\": \"42\", \"days\": 3, \"code\": \"1\", \"note\": null, "
                                       "\"at\": {\"x\": 1}, \"any\": true, \"extra\": [1]}");
        assert_string_equal(s.args[1], "{\"n\": 7}");
        outparse_free(p);

        /* a value of a type the schema does not allow stays the text the model wrote */
        memset(&s, 0, sizeof s);
        params = NULL;
        const char *ints = "{\"properties\":{\"d\":{\"type\":\"integer\"}}}";
        assert_int_equal(json_parse(ints, strlen(ints), "schema", &params, NULL, 0), 0);
        tp[0] = params;
        assert_int_equal(outparse_new(tok, &c, &p, NULL, 0), 0);
        json_free(params);
        feed_model_text(p, "<tool_call>get_weather<param_key>d</param_key><param_value>true</param_value></tool_call>");
        assert_string_equal(s.args[0], "{\"d\": \"true\"}");
        outparse_free(p);
}

static void test_stop_strings(void **state) {
        static const char *stops[] = { "STOP!", "\n\nUser:" };
        struct seen s;

        /* spanning three tokens; the prefix is held back, never emitted partially */
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, false, -1, stops, 2, NULL, 0);
        feed(p, ID_TEXT, "abc ST");
        assert_string_equal(s.content, "abc ");
        feed(p, ID_TEXT, "O");
        assert_string_equal(s.content, "abc ");
        feed(p, ID_TEXT, "P! tail");
        assert_string_equal(s.content, "abc ");
        assert_string_equal(s.stop_string, "STOP!");
        assert_string_equal(s.reason, "stop");
        assert_int_equal(s.stop_id, -1);
        assert_string_equal(s.order, "cS");

        /* a false start is released as soon as it cannot match */
        _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, false, -1, stops, 2, NULL, 0);
        feed(q, ID_TEXT, "x S");
        assert_string_equal(s.content, "x ");
        feed(q, ID_TEXT, "TO");
        assert_string_equal(s.content, "x ");
        feed(q, ID_TEXT, "Px");
        assert_string_equal(s.content, "x STOPx");
        feed(q, ID_TEXT, "\n");
        feed(q, ID_TEXT, "\nUs");
        assert_string_equal(s.content, "x STOPx");
        assert_int_equal(outparse_finish(q, "length"), 0);
        assert_string_equal(s.content, "x STOPx\n\nUs"); /* the end releases a held prefix */
        assert_int_equal(s.n_stops, 1);

        /* not in reasoning: stop strings end the answer (a ReAct client's "\nObservation:" in
         * the thinking must not leave an empty answer); the answer after it still stops */
        _cleanup_(outparse_freep) struct outparse *r = new_parser(&s, true, -1, stops, 2, NULL, 0);
        feed_model_text(r, "think STOP! more");
        assert_string_equal(s.reasoning, "think STOP! more");
        assert_int_equal(s.n_stops, 0);
        assert_int_equal(outparse_feed_text(r, " STOP!", 6), 0); /* held-back bytes flushed, too */
        assert_string_equal(s.reasoning, "think STOP! more STOP!");
        assert_int_equal(s.n_stops, 0);
        feed(r, ID_END_THINK, "</think>");
        feed(r, ID_TEXT, "answer STOP! tail");
        assert_string_equal(s.content, "answer ");
        assert_string_equal(s.stop_string, "STOP!");
        assert_int_equal(s.n_stops, 1);

        /* a stop string does not span </think>: "STO" in the reasoning, "P!" in the answer */
        _cleanup_(outparse_freep) struct outparse *u = new_parser(&s, true, -1, stops, 2, NULL, 0);
        feed(u, ID_TEXT, "a STO");
        assert_string_equal(s.reasoning, "a STO");
        feed(u, ID_END_THINK, "</think>");
        feed(u, ID_TEXT, "P!");
        assert_string_equal(s.reasoning, "a STO");
        assert_string_equal(s.content, "P!");
        assert_int_equal(s.n_stops, 0);

        struct outparse *bad = NULL;
        static const char *empty[] = { "" };
        struct outparse_config c = { .stop_strings = empty, .n_stop_strings = 1, .emit = collect, .userdata = &s };
        assert_int_equal(outparse_new(tok, &c, &bad, NULL, 0), -EINVAL);
        assert_string_equal(log_last_error(), "stop string 0 is empty, non-empty text expected");
}

static void test_stop_ids_and_turn_end(void **state) {
        struct seen s;
        const int32_t ids[] = { ID_TEXT };
        _cleanup_(outparse_freep) struct outparse *p = new_parser(&s, false, -1, NULL, 0, ids, 1);
        feed(p, 1000, "b");
        feed(p, ID_TEXT, "a");
        assert_string_equal(s.content, "b");
        assert_int_equal(s.stop_id, ID_TEXT);

        const int32_t ends[] = { 1, 3, ID_USER, 5, 6, ID_TOOL_RESPONSE, 14 };
        for (size_t i = 0; i < ELEMENTSOF(ends); i++) {
                _cleanup_(outparse_freep) struct outparse *q = new_parser(&s, false, -1, NULL, 0, NULL, 0);
                feed(q, ID_TEXT, "x");
                feed(q, ends[i], NULL);
                assert_true(outparse_stopped(q));
                assert_string_equal(s.reason, "stop");
                assert_int_equal(s.stop_id, ends[i]);
                assert_string_equal(s.content, "x");
        }
        /* <_sep> (control, not registered) does not end the turn */
        _cleanup_(outparse_freep) struct outparse *r = new_parser(&s, false, -1, NULL, 0, NULL, 0);
        feed(r, 8, "");
        assert_false(outparse_stopped(r));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_thinking),
                cmocka_unit_test(test_thinking_off),
                cmocka_unit_test(test_end_think_missing),
                cmocka_unit_test(test_thinking_budget),
                cmocka_unit_test(test_tool_call_params),
                cmocka_unit_test(test_tool_call_json_back_to_back),
                cmocka_unit_test(test_tool_call_malformed),
                cmocka_unit_test(test_tool_call_offered_names),
                cmocka_unit_test(test_tool_call_typed_by_schema),
                cmocka_unit_test(test_stop_strings),
                cmocka_unit_test(test_stop_ids_and_turn_end),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
