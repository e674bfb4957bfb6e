/* SPDX-License-Identifier: MIT */
/* libFuzzer target for xing4-http's request parsing and mapping: the first byte picks the
 * endpoint (chat completions, completions, messages, messages/count_tokens, responses), the rest
 * is its JSON body. Every body is either refused with a 4xx/5xx error that names what is wrong
 * (and prints in both APIs' error shapes) or becomes a protocol request; accepted ones are then
 * answered with a scripted result, non-streaming and as an event stream, and every streamed event
 * must be one "event:"/"data:" block whose data reads back as JSON. Responses are stored for
 * previous_response_id (a store bounded to a few entries, so the fuzzer can chain them). */
#include <event2/buffer.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

static void check_stream_bytes(struct evbuffer *b) {
        size_t n = evbuffer_get_length(b);
        char *s = malloc(n + 1);
        if (!s)
                return;
        evbuffer_remove(b, s, n);
        s[n] = 0;
        for (char *p = s; *p;) {
                char *end = strstr(p, "\n\n");
                if (!end)
                        __builtin_trap(); /* an event not ended by a blank line */
                *end = 0;
                char *data = strstr(p, "data: ");
                if (!data)
                        __builtin_trap();
                if (strcmp(data + 6, "[DONE]") != 0) {
                        /* JSON_ALLOW_NUL: a request's "\u0000" (accepted, as the bridge
                         * loads bodies so) comes back escaped in the echo */
                        json_t *j = json_loads(data + 6, JSON_ALLOW_NUL, NULL);
                        if (!j || strchr(data + 6, '\n'))
                                __builtin_trap();
                        json_decref(j);
                }
                p = end + 2;
        }
        free(s);
}

static void answer(enum api_kind kind, struct api_request *r) {
        struct api_result res = { 0 };
        const char *id = kind == API_RESPONSES ? "resp_0123456789abcdef0123456789abcdef" : "msg_0123456789abcdef0123456789abcdef";
        api_result_add_text(&res, true, "why", 3);
        api_result_add_text(&res, false, "{\"a\": 1}", 8);
        api_result_add_call(&res, "f", "{\"x\": \"\\u00e9\"}");
        struct x4_done d = { .status = X4_OK, .finish_reason = X4_FINISH_STOP, .prompt_tokens = 5,
                             .cached_tokens = 9, .completion_tokens = 3, .stop = "END" };
        json_t *j = NULL;
        if (kind == API_MESSAGES)
                j = am_response_json(id, r->model, &res, &d);
        else if (kind == API_RESPONSES)
                j = rs_response_json(id, 0, r->model, r->echo, r->reasoning_out, &res, &d);
        else if (kind == API_CHAT || kind == API_COMPLETION)
                j = api_response_json(kind, "chatcmpl-0123456789abcdef0123456789abcdef", 0, r->model, &res, &d);
        if (kind != API_COUNT_TOKENS && !j)
                __builtin_trap();
        json_decref(j);
        if (kind == API_MESSAGES || kind == API_RESPONSES) {
                struct api_result sres = { 0 };
                struct ev_stream s;
                struct evbuffer *b = evbuffer_new();
                ev_stream_init(&s, kind, id, r->model, 0, r->echo, &sres);
                static const struct { int channel; const char *text, *tool, *args; } chunks[] = {
                        { X4_CHANNEL_REASONING, "th", NULL, NULL }, { X4_CHANNEL_CONTENT, "he\"llo", NULL, NULL },
                        { X4_CHANNEL_TOOL_CALL, "", NULL, NULL }, { X4_CHANNEL_TOOL_CALL, "", "g", "{}" },
                        { X4_CHANNEL_CONTENT, "more", NULL, NULL },
                };
                for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
                        struct x4_chunk c = { .text = chunks[i].text, .text_len = strlen(chunks[i].text),
                                              .channel = chunks[i].channel, .tool_name = chunks[i].tool,
                                              .tool_arguments_json = chunks[i].args };
                        if (c.tool_name)
                                api_result_add_call(&sres, c.tool_name, c.tool_arguments_json);
                        else if (c.text_len)
                                api_result_add_text(&sres, c.channel == X4_CHANNEL_REASONING, c.text, c.text_len);
                        ev_stream_chunk(&s, &c, b);
                }
                ev_stream_finish(&s, &d, b);
                struct api_error e;
                api_fail(&e, 500, "server_error", "x", "p", "late failure");
                ev_stream_error(&s, &e, b);
                check_stream_bytes(b);
                evbuffer_free(b);
                ev_stream_done(&s);
                api_result_done(&sres);
        }
        if (kind == API_RESPONSES && r->store) {
                /* stored with its response object, read back and, every other time, deleted */
                static unsigned n_stored;
                rs_store_put(id, 0, r->conv, &res, rs_response_json(id, 0, r->model, r->echo, r->reasoning_out, &res, &d),
                             r->input);
                json_t *back = rs_store_response(id, 0);
                if (back && json_object_size(back) == 0)
                        __builtin_trap();
                json_t *items = rs_store_input(id, 0); /* GET /v1/responses/ID/input_items */
                if (items && !json_is_array(items))
                        __builtin_trap();
                if (++n_stored & 1)
                        (void) rs_store_delete(id, 0);
        }
        api_result_done(&res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static char *aliases[] = { "claude-*", "gpt-?o" };
        static bool init;
        if (!init) {
                rs_store_configure(4, 1 << 20, 3600);
                init = true;
        }
        if (size < 1)
                return 0;
        static const enum api_kind kinds[] = { API_CHAT, API_COMPLETION, API_MESSAGES, API_COUNT_TOKENS,
                                               API_RESPONSES };
        enum api_kind kind = kinds[data[0] % 5];
        struct api_config cfg = { .model_id = "xing4", .aliases = aliases, .n_aliases = 2 };
        struct api_request r;
        struct api_error e;
        if (api_parse_request(kind, (const char *) data + 1, size - 1, &cfg, &r, &e) < 0) {
                if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type)
                        __builtin_trap();
                if (e.status == 400 && e.code && strcmp(e.code, "invalid_json") != 0 && !e.param[0] &&
                    strcmp(e.code, "invalid_value") == 0)
                        __builtin_trap(); /* a bad value names its field */
                json_t *a = api_error_json(&e, FLAVOR_OPENAI), *b = api_error_json(&e, FLAVOR_ANTHROPIC);
                if (!a || !b)
                        __builtin_trap();
                json_decref(a);
                json_decref(b);
                return 0;
        }
        if (!r.req || !r.model)
                __builtin_trap();
        answer(kind, &r);
        api_request_done(&r);
        return 0;
}
