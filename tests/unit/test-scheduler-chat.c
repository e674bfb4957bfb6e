/* SPDX-License-Identifier: MIT */
/* The prompt the engine thread renders from chat messages, read back from the DONE event's
 * sequence (prompt ids + output ids) and decoded: an assistant's earlier tool call sent the
 * OpenAI way (arguments as JSON text, {"id", "type", "function": {...}}) renders in the Xing4
 * form `<tool_call>NAME<param_key>K</param_key><param_value>V</param_value></tool_call>` (docs/model.md §7)
 * with the model's own tokenizer.chat_template AND with the built-in renderer (a copy of the
 * fixture whose template key is renamed, so the scheduler falls back to it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <poll.h>

#include "../kernels/backend.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"
#include "scheduler.h"
#include "common/log.h"

#define FIXTURE_DIR X4_FIXTURES "/xing4-tiny-a"

static char *read_file(const char *path, size_t *len) {
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        long n = ftell(f);
        assert_true(n > 0);
        rewind(f);
        char *buf = malloc((size_t) n);
        assert_non_null(buf);
        assert_int_equal(fread(buf, 1, (size_t) n, f), (size_t) n);
        fclose(f);
        *len = (size_t) n;
        return buf;
}

static void write_file(const char *path, const char *data, size_t len) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
}

/* The fixture's own template ignores tool calls; the "model's template" copy gets this one, which
 * renders them the Xing4 way only when the arguments are a mapping (it fits the fixture's 228
 * bytes, padded with a comment, so no offset in the file moves). */
static const char model_template[] =
        "{%for m in messages%}{%for c in m.tool_calls%}<tool_call>{{c.function.name}}{%for k,v in "
        "c.function.arguments.items()%}<param_key>{{k}}</param_key><param_value>{{v}}"
        "</param_value>{%endfor%}</tool_call>{%endfor%}{%endfor%}";

/* A copy of the fixture (model.gguf + config.json) in a fresh folder. builtin: the GGUF key
 * tokenizer.chat_template is renamed (same length) and the model has none; otherwise the template
 * text is replaced by model_template. */
static void make_copy(char dir[static 64], bool builtin) {
        char path[256];
        size_t len;
        snprintf(dir, 64, "/tmp/x4-sched-chat-XXXXXX");
        assert_non_null(mkdtemp(dir));
        char *gguf = read_file(FIXTURE_DIR "/model.gguf", &len);
        if (builtin) {
                static const char key[] = "tokenizer.chat_template";
                char *at = memmem(gguf, len, key, sizeof key - 1);
                assert_non_null(at);
                at[sizeof key - 2] = 'X';
                assert_null(memmem(gguf, len, key, sizeof key - 1));
        } else {
                /* key, then u32 type (8 = string), u64 length, the text */
                static const char key[] = "tokenizer.chat_template";
                char *at = memmem(gguf, len, key, sizeof key - 1);
                assert_non_null(at);
                at += sizeof key - 1;
                uint64_t n;
                memcpy(&n, at + 4, sizeof n);
                assert_true(sizeof model_template - 1 + 4 <= n);
                char *t = at + 12;
                size_t k = sizeof model_template - 1;
                memcpy(t, model_template, k);
                memcpy(t + k, "{#", 2);
                memset(t + k + 2, ' ', n - k - 4);
                memcpy(t + n - 2, "#}", 2);
        }
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        write_file(path, gguf, len);
        free(gguf);
        char *cfg = read_file(FIXTURE_DIR "/config.json", &len);
        snprintf(path, sizeof path, "%s/config.json", dir);
        write_file(path, cfg, len);
        free(cfg);
}

static void remove_copy(const char *dir) {
        char path[256];
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
}

static char *xstrdup(const char *s) {
        char *c = strdup(s);
        assert_non_null(c);
        return c;
}

/* Renders the history through a scheduler on the given copy and returns the decoded prompt. */
static char *rendered_prompt(bool builtin, const char *tool_calls_json) {
        char dir[64], path[256];
        struct x4_model *model = NULL;
        struct tokenizer *tok = NULL;
        struct x4_backend *backend = NULL;
        struct sched *s = NULL;

        make_copy(dir, builtin);
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        struct x4_model_params mp = {.path = path};
        assert_int_equal(x4_model_open(&mp, &model, NULL, 0), 0);
        assert_int_equal(tokenizer_new_from_gguf(x4_model_gguf(model), &tok, NULL, 0), 0);
        struct x4_backend_params bp = {.n_threads = 1, .page_tokens = 16, .n_pages = 16};
        assert_int_equal(x4_backend_cpu.create(model, &bp, &backend, NULL, 0), 0);
        struct sched_params sp = {.model = model, .ops = &x4_backend_cpu, .backend = backend,
                                  .tokenizer = tok, .max_running = 2, .max_waiting = 2,
                                  .prefill_chunk = 64};
        assert_int_equal(sched_new(&sp, &s), 0);
        assert_int_equal(sched_start(s), 0);

        struct sched_request *r = calloc(1, sizeof *r);
        assert_non_null(r);
        r->prompt = SCHED_PROMPT_CHAT;
        r->n_messages = 3;
        r->messages = calloc(3, sizeof *r->messages);
        assert_non_null(r->messages);
        r->messages[0].role = xstrdup("user");
        r->messages[0].content = xstrdup("Weather in Paris?");
        r->messages[1].role = xstrdup("assistant");
        r->messages[1].tool_calls_json = xstrdup(tool_calls_json);
        r->messages[2].role = xstrdup("tool");
        r->messages[2].content = xstrdup("{\"temp_c\": 21}");
        r->messages[2].name = xstrdup("get_weather");
        r->has_max_tokens = true;
        r->max_tokens = 1;
        r->sampling.has_temperature = true;
        r->sampling.temperature = 0.0f;
        r->ignore_eos = true;
        r->enable_thinking = -1;
        r->cookie = r;
        assert_int_equal(sched_submit(s, r, NULL), 0);

        char *text = NULL;
        for (bool done = false; !done;) {
                struct pollfd p = {.fd = sched_event_fd(s), .events = POLLIN};
                assert_true(poll(&p, 1, 60000) == 1); /* a stuck engine fails, not hangs */
                uint64_t v;
                (void) !read(p.fd, &v, sizeof v);
                for (struct sched_event *e = sched_pop_events(s), *next; e; e = next) {
                        next = e->next;
                        if (e->kind == SCHED_EVENT_ERROR)
                                fail_msg("chat request refused: %s", e->message);
                        if (e->kind == SCHED_EVENT_DONE) {
                                assert_true(e->prompt_tokens > 0 &&
                                            e->prompt_tokens <= e->n_sequence);
                                assert_int_equal(tokenizer_decode(tok, e->sequence,
                                                                  e->prompt_tokens, 0, &text,
                                                                  NULL),
                                                 0);
                                done = true;
                        }
                        sched_event_free(e);
                }
        }
        sched_free(s);
        x4_backend_cpu.destroy(backend);
        tokenizer_free(tok);
        x4_model_free(model);
        remove_copy(dir);
        return text;
}

static const char openai_calls[] =
        "[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"}}]";
static const char want_call[] = "<tool_call>get_weather<param_key>city</param_key><param_value>Paris"
                                "</param_value><param_key>days</param_key><param_value>2"
                                "</param_value></tool_call>";

static void expect_param_form(bool builtin) {
        char *text = rendered_prompt(builtin, openai_calls);
        if (!strstr(text, want_call))
                fail_msg("%s renderer: prompt\n%s\ndoes not contain\n%s",
                         builtin ? "built-in" : "model's", text, want_call);
        /* not the JSON-text fallback form as well */
        assert_null(strstr(text, "\"arguments\""));
        /* the built-in one renders the tool's answer in the tool turn */
        if (builtin)
                assert_non_null(strstr(text, "<tool_response>{\"temp_c\": 21}</tool_response>"));
        free(text);
}

static void test_openai_string_arguments_builtin(void **state) {
        (void) state;
        expect_param_form(true);
}

static void test_openai_string_arguments_model_template(void **state) {
        (void) state;
        expect_param_form(false);
}

/* Arguments that are not JSON stay text: the fallback form, not a refusal. */
static void test_unparsable_arguments_keep_text(void **state) {
        (void) state;
        char *text = rendered_prompt(true, "[{\"type\": \"function\", \"function\": {\"name\": "
                                           "\"f\", \"arguments\": \"not json\"}}]");
        if (!strstr(text, "<tool_call>{\"name\": \"f\", \"arguments\": not json}</tool_call>"))
                fail_msg("prompt\n%s\nlacks the text form of the call", text);
        free(text);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_openai_string_arguments_builtin),
                cmocka_unit_test(test_openai_string_arguments_model_template),
                cmocka_unit_test(test_unparsable_arguments_keep_text),
        };
        log_set_max_level(LOG_CRIT);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
