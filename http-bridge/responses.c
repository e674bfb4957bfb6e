/* SPDX-License-Identifier: MIT */
/* OpenAI's Responses API (POST /v1/responses) ⇄ libx4client.
 *
 * The input (a string, or items: messages, function_call, function_call_output,
 * custom_tool_call, custom_tool_call_output, reasoning) becomes the protocol's chat; `instructions` its system text. previous_response_id continues a
 * conversation this bridge answered: it keeps each stored response's conversation (input items
 * and output, in the protocol's message shape) in a bounded store (entries, bytes, age), and sends
 * the whole conversation again; the daemon's prefix cache finds the pages of the earlier turns, so
 * only the new turn is prefilled.
 *
 * Streaming sends OpenAI's typed events (response.created, response.in_progress,
 * response.output_item.added, response.content_part.added, response.output_text.delta, ...,
 * response.function_call_arguments.delta/done, response.custom_tool_call_input.delta/done,
 * response.completed), each with its sequence_number.
 *
 * Reasoning comes out as reasoning items whose content is the model's thinking (reasoning_text).
 * reasoning.summary asks for a summary as well, which OpenAI's clients (Codex, the SDKs) show:
 * the bridge has no summarizer, so the summary is that same text, one summary_text part (events
 * response.reasoning_summary_part.added, response.reasoning_summary_text.delta/done,
 * response.reasoning_summary_part.done). include "reasoning.encrypted_content" adds
 * encrypted_content, the text in a form a later request's input restores it from (a client that
 * keeps no server state, store false, sends the item back): not a secret, only a carrier. */
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "bridge.h"
#include "common/macro.h"


/* ---- the conversation store ---------------------------------------------------------------------- */

struct stored {
        struct stored *next;
        char id[64];
        int key;
        json_t *conv;
        json_t *response; /* the response object as answered (GET /v1/responses/ID) */
        json_t *input;    /* its input items (GET /v1/responses/ID/input_items) */
        size_t bytes;
        time_t at;
};

/* The stored responses (previous_response_id), the module's whole state. */
static struct {
        struct stored *head, *tail; /* oldest first */
        size_t n, bytes;
        size_t max_n, max_bytes;
        int retention;
} store = { .max_n = 256, .max_bytes = 64u << 20, .retention = 3600 };

void rs_store_configure(size_t max_entries, size_t max_bytes, int retention_s) {
        store.max_n = max_entries;
        store.max_bytes = max_bytes;
        store.retention = retention_s;
}

/* An entry already unlinked: its size off the store's count, then freed with what it holds */
static void stored_free(struct stored *s) {
        store.n--;
        store.bytes -= s->bytes;
        json_decref(s->conv);
        json_decref(s->response);
        json_decref(s->input);
        free(s);
}

static void store_drop_oldest(void) {
        struct stored *s = store.head;
        store.head = s->next;
        if (!store.head)
                store.tail = NULL;
        stored_free(s);
}

static void store_expire(void) {
        time_t now = time(NULL);
        while (store.head && (now - store.head->at > store.retention || store.n > store.max_n ||
                              store.bytes > store.max_bytes))
                store_drop_oldest();
}

void rs_store_clear(void) {
        while (store.head)
                store_drop_oldest();
}

/* The entry stored under id for key, or NULL. */
static struct stored *store_find(const char *id, int key) {
        store_expire();
        for (struct stored *s = store.head; s; s = s->next)
                if (streq(s->id, id) && s->key == key)
                        return s;
        return NULL;
}

json_t *rs_store_get(const char *id, int key) {
        struct stored *s = store_find(id, key);
        return s ? s->conv : NULL;
}

/* The stored response object of id (NULL: none for this key); NULL, 0 when deleted or not there. */
json_t *rs_store_response(const char *id, int key) {
        struct stored *s = store_find(id, key);
        return s ? s->response : NULL;
}

json_t *rs_store_input(const char *id, int key) {
        struct stored *s = store_find(id, key);
        return s ? s->input : NULL;
}

/* A request's input as the input_items list shows it: a string is one user message; a message's
 * string content becomes one input_text (output_text for the assistant's) part; every item gets
 * an id (msg_ and the response's random part, then its index) unless it has one. */
static json_t *input_items(json_t *input, const char *id) {
        json_t *items = json_is_string(input) ? json_pack("[{s:s, s:O}]", "role", "user", "content", input)
                                              : json_deep_copy(input);
        const char *rnd = strchr(id, '_') ? strchr(id, '_') + 1 : id;
        size_t i;
        json_t *it;
        if (!json_is_array(items)) {
                json_decref(items);
                return NULL;
        }
        json_array_foreach(items, i, it) {
                if (!json_is_object(it))
                        continue;
                json_t *type = json_object_get(it, "type");
                const char *role = json_string_value(json_object_get(it, "role"));
                json_t *content = json_object_get(it, "content");
                if (!type && role)
                        json_object_set_new(it, "type", json_string("message"));
                if (role && json_is_string(content))
                        json_object_set_new(it, "content",
                                            json_pack("[{s:s, s:O}]", "type",
                                                      streq(role, "assistant") ? "output_text" : "input_text",
                                                      "text", content));
                if (!json_is_string(json_object_get(it, "id"))) {
                        char iid[96];
                        snprintf(iid, sizeof iid, "%s_%.32s_%zu", role ? "msg" : "item", rnd, i);
                        json_object_set_new(it, "id", json_string(iid));
                }
                if (role && !json_object_get(it, "status"))
                        json_object_set_new(it, "status", json_string("completed"));
        }
        return items;
}

bool rs_store_delete(const char *id, int key) {
        store_expire();
        for (struct stored **p = &store.head, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
                struct stored *s = *p;
                if (!streq(s->id, id) || s->key != key)
                        continue;
                *p = s->next;
                if (store.tail == s)
                        store.tail = prev;
                stored_free(s); /* the input items too (they leaked here) */
                return true;
        }
        return false;
}

void rs_store_put(const char *id, int key, json_t *conv, const struct api_result *res, json_t *response,
                  json_t *input) {
        if (store.max_n == 0 || !conv) {
                json_decref(response);
                return;
        }
        json_t *c = json_deep_copy(conv);
        json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", res->content ? res->content : "",
                              res->content_len);
        if (!c || !m) {
                json_decref(c);
                json_decref(m);
                json_decref(response);
                return;
        }
        if (res->reasoning)
                json_object_set_new(m, "reasoning", json_stringn(res->reasoning, res->reasoning_len));
        if (res->n_calls) {
                json_t *calls = json_array();
                for (size_t i = 0; i < res->n_calls; i++) {
                        char cid[64];
                        api_call_id(cid, sizeof cid, "call_", id, i);
                        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cid, "type", "function",
                                                               "function", "name", res->calls[i].name, "arguments",
                                                               res->calls[i].arguments));
                }
                json_object_set_new(m, "tool_calls", calls);
        }
        json_array_append_new(c, m);
        char *dump = json_dumps(c, JSON_COMPACT);
        char *rdump = response ? json_dumps(response, JSON_COMPACT) : NULL;
        json_t *items = input ? input_items(input, id) : NULL;
        char *idump = items ? json_dumps(items, JSON_COMPACT) : NULL;
        struct stored *s = calloc(1, sizeof *s);
        if (!dump || !s) {
                free(dump);
                free(rdump);
                free(idump);
                free(s);
                json_decref(c);
                json_decref(response);
                json_decref(items);
                return;
        }
        s->bytes = strlen(dump) + (rdump ? strlen(rdump) : 0) + (idump ? strlen(idump) : 0) + sizeof *s;
        free(dump);
        free(rdump);
        free(idump);
        s->response = response;
        s->input = items;
        snprintf(s->id, sizeof s->id, "%s", id);
        s->key = key;
        s->conv = c;
        s->at = time(NULL);
        if (store.tail)
                store.tail->next = s;
        else
                store.head = s;
        store.tail = s;
        store.n++;
        store.bytes += s->bytes;
        store_expire();
}

/* ---- parsing ------------------------------------------------------------------------------------- */

/* The text of a message's content: a string or an array of text parts. */
static int content_text(json_t *v, const char *param, struct sbuf *out, struct api_error *e) {
        if (json_is_string(v))
                return sbuf_add_text(out, json_string_value(v), json_string_length(v)) < 0 ? OOM(e) : 0;
        if (!json_is_array(v))
                return api_bad(e, param, "a string or an array of content parts expected, got %s",
                               v ? api_type_name(v) : "nothing");
        size_t i;
        json_t *part;
        json_array_foreach(v, i, part) {
                char p[128]; /* room for param (at most 95) and the index */
                snprintf(p, sizeof p, "%s[%zu]", param, i);
                const char *type = json_string_value(json_object_get(part, "type"));
                if (!json_is_object(part) || !type)
                        return api_bad(e, p, "an object with a \"type\" expected");
                const char *key = streq(type, "refusal") ? "refusal" : "text";
                if (!streq(type, "input_text") && !streq(type, "output_text") && !streq(type, "text") &&
                    !streq(type, "refusal"))
                        return api_fail(e, 400, "invalid_request_error", "unsupported_content_type", p,
                                        "%s: content part type \"%s\" is not supported; xing4d's model reads text "
                                        "only (input_text, output_text)", p, type);
                json_t *t = json_object_get(part, key);
                if (!json_is_string(t))
                        return api_bad(e, p, "\"%s\" must be a string", key);
                if (sbuf_add_text(out, json_string_value(t), json_string_length(t)) < 0)
                        return OOM(e);
        }
        return 0;
}

/* The text of item `it` (named `p` in errors) under `key` into *text; 0, or -1 with e filled and
 * *text empty. */
static int item_text(json_t *it, const char *p, const char *key, struct sbuf *text, struct api_error *e) {
        char q[96];
        snprintf(q, sizeof q, "%s.%s", p, key);
        if (content_text(json_object_get(it, key), q, text, e) < 0) {
                free(text->s);
                *text = (struct sbuf) { 0 };
                return -1;
        }
        return 0;
}

/* A message of `role` taking `text`; with `reasoning` (NULL for none) and text in it, the
 * message takes that as its "reasoning" too. */
static json_t *msg_new(const char *role, struct sbuf *text, struct sbuf *reasoning) {
        json_t *m = json_pack("{s:s, s:s}", "role", role, "content", text->s ? text->s : "");
        free(text->s);
        *text = (struct sbuf) { 0 };
        if (m && reasoning && reasoning->s) {
                json_object_set_new(m, "reasoning", json_string(reasoning->s));
                free(reasoning->s);
                *reasoning = (struct sbuf) { 0 };
        }
        return m;
}

/* m (NULL when making it ran out of memory) appended to conv; 0, or -1 with e filled. */
static int conv_append(json_t *conv, json_t *m, struct api_error *e) {
        return !m || json_array_append_new(conv, m) < 0 ? OOM(e) : 0;
}

/* The last message of conv if it is an assistant's that tool calls may be added to. */
static json_t *open_assistant(json_t *conv) {
        json_t *last = json_array_get(conv, json_array_size(conv) - 1);
        return last && streq(json_string_value(json_object_get(last, "role")), "assistant") ? last : NULL;
}

/* ---- reasoning the client carries (include "reasoning.encrypted_content") ------------------------ */

/* A reasoning item's encrypted_content as this bridge writes it: this prefix (the version of the
 * form), then the item's text in base64. Anyone can read it back: it lets a client that keeps no
 * state here (store false) send the reasoning with the next turn, as it does OpenAI's. */
#define ENCRYPTED_PREFIX "xing4-reasoning-v1:"

static const char b64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* text's encrypted_content (a new string; NULL when out of memory). */
static json_t *encrypted_content(const char *text, size_t len) {
        size_t pre = sizeof ENCRYPTED_PREFIX - 1;
        _cleanup_free_ char *buf = malloc(pre + (len + 2) / 3 * 4 + 1);
        if (!buf)
                return NULL;
        memcpy(buf, ENCRYPTED_PREFIX, pre);
        char *o = buf + pre;
        for (size_t i = 0; i < len; i += 3) {
                uint32_t v = (uint32_t) (unsigned char) text[i] << 16;
                if (i + 1 < len)
                        v |= (uint32_t) (unsigned char) text[i + 1] << 8;
                if (i + 2 < len)
                        v |= (unsigned char) text[i + 2];
                *o++ = b64_digits[v >> 18 & 63];
                *o++ = b64_digits[v >> 12 & 63];
                *o++ = i + 1 < len ? b64_digits[v >> 6 & 63] : '=';
                *o++ = i + 2 < len ? b64_digits[v & 63] : '=';
        }
        return json_stringn(buf, (size_t) (o - buf));
}

static int b64_value(char c) {
        const char *d = c ? strchr(b64_digits, c) : NULL;
        return d ? (int) (d - b64_digits) : -1;
}

/* The bytes of base64 text s (n characters, padded) into out (room for n / 4 * 3); their number,
 * or -1 when s is not base64. */
static ssize_t b64_decode(const char *s, size_t n, unsigned char *out) {
        size_t k = 0;
        if (n % 4)
                return -1;
        for (size_t i = 0; i < n; i += 4) {
                int a = b64_value(s[i]), b = b64_value(s[i + 1]), c = b64_value(s[i + 2]), d = b64_value(s[i + 3]);
                bool last = i + 4 == n;
                if (a < 0 || b < 0 || (c < 0 && !(last && s[i + 2] == '=' && s[i + 3] == '=')) ||
                    (d < 0 && !(last && s[i + 3] == '=')))
                        return -1;
                out[k++] = (unsigned char) (a << 2 | b >> 4);
                if (c >= 0)
                        out[k++] = (unsigned char) ((b & 15) << 4 | c >> 2);
                if (d >= 0)
                        out[k++] = (unsigned char) ((c & 3) << 6 | d);
        }
        return (ssize_t) k;
}

/* The text of reasoning item `it` (named `p` in errors) from its encrypted_content, when that is
 * one of ours, appended to *text (after a line break when there is text already): 1; 0 when it
 * has none of ours; -1 with e filled when ours is damaged. */
static int restore_reasoning(json_t *it, const char *p, struct sbuf *text, struct api_error *e) {
        json_t *v = json_object_get(it, "encrypted_content");
        const char *enc = json_string_value(v);
        size_t pre = sizeof ENCRYPTED_PREFIX - 1;
        if (!enc || strncmp(enc, ENCRYPTED_PREFIX, pre) != 0)
                return 0;
        size_t n = json_string_length(v) - pre;
        _cleanup_free_ unsigned char *raw = malloc(n / 4 * 3 + 1);
        if (!raw)
                return OOM(e);
        ssize_t len = b64_decode(enc + pre, n, raw);
        /* the text goes to the daemon as a JSON string: it must be UTF-8 */
        _cleanup_(json_decrefp) json_t *utf8 = len < 0 ? NULL : json_stringn((const char *) raw, (size_t) len);
        if (!utf8) {
                char q[96];
                snprintf(q, sizeof q, "%s.encrypted_content", p);
                return api_fail(e, 400, "invalid_request_error", "invalid_encrypted_content", q,
                                "%s: damaged (\"" ENCRYPTED_PREFIX "\" then the base64 of UTF-8 text expected)", q);
        }
        if ((text->len && sbuf_add(text, "\n", 1) < 0) || sbuf_add_text(text, (const char *) raw, (size_t) len) < 0)
                return OOM(e);
        return 1;
}

static int parse_input(json_t *input, json_t *conv, struct api_error *e) {
        struct sbuf reasoning = { 0 };
        _cleanup_(json_decrefp) json_t *names = json_object();
        /* calls of earlier stored turns answer to their names too */
        size_t i;
        json_t *it;
        json_array_foreach(conv, i, it) {
                size_t k;
                json_t *tc;
                json_array_foreach(json_object_get(it, "tool_calls"), k, tc) {
                        const char *id = json_string_value(json_object_get(tc, "id"));
                        json_t *name = json_object_get(json_object_get(tc, "function"), "name");
                        if (id && json_is_string(name))
                                json_object_set(names, id, name);
                }
        }
        if (json_is_string(input)) {
                struct sbuf text = { 0 };
                if (sbuf_add_text(&text, json_string_value(input), json_string_length(input)) < 0)
                        return OOM(e);
                return conv_append(conv, msg_new("user", &text, NULL), e);
        }
        if (!json_is_array(input))
                return api_bad(e, "input", "a string or an array of input items expected, got %s",
                               api_type_name(input));
        if (json_array_size(input) > API_MAX_MESSAGES)
                return api_bad(e, "input", "at most %d items per request, got %zu", API_MAX_MESSAGES,
                               json_array_size(input));
        int ret = 0;
        json_array_foreach(input, i, it) {
                char p[64], q[96];
                snprintf(p, sizeof p, "input[%zu]", i);
                if (!json_is_object(it)) {
                        ret = api_bad(e, p, "an object expected, got %s", api_type_name(it));
                        break;
                }
                const char *type = json_string_value(json_object_get(it, "type"));
                if (!type || streq(type, "message")) {
                        const char *role = json_string_value(json_object_get(it, "role"));
                        snprintf(q, sizeof q, "%s.role", p);
                        if (streq(role, "developer"))
                                role = "system";
                        if (!streq(role, "user") && !streq(role, "system") && !streq(role, "assistant")) {
                                ret = api_bad(e, q, "\"user\", \"assistant\", \"system\" or \"developer\" expected");
                                break;
                        }
                        struct sbuf text = { 0 };
                        if ((ret = item_text(it, p, "content", &text, e)) < 0 ||
                            (ret = conv_append(conv, msg_new(role, &text, streq(role, "assistant") ? &reasoning : NULL),
                                               e)) < 0)
                                break;
                } else if (streq(type, "function_call") || streq(type, "custom_tool_call")) {
                        /* a custom tool's call is the call of the function it was offered as
                         * (custom_tool), with its input as the one argument */
                        bool custom = streq(type, "custom_tool_call");
                        const char *call_id = json_string_value(json_object_get(it, "call_id"));
                        const char *name = json_string_value(json_object_get(it, "name"));
                        json_t *args = json_object_get(it, custom ? "input" : "arguments");
                        if (!call_id || !name || !json_is_string(args)) {
                                ret = api_bad(e, p, "a %s item needs \"call_id\", \"name\" and \"%s\" strings", type,
                                              custom ? "input" : "arguments");
                                break;
                        }
                        _cleanup_(json_decrefp) json_t *wrapped = NULL;
                        if (custom) {
                                _cleanup_(json_decrefp) json_t *in = json_pack("{s:O}", "input", args);
                                _cleanup_free_ char *text = in ? json_dumps(in, JSON_COMPACT) : NULL;
                                if (!text || !(wrapped = json_string(text))) {
                                        ret = OOM(e);
                                        break;
                                }
                                args = wrapped;
                        }
                        json_t *m = open_assistant(conv);
                        if (!m || reasoning.s) {
                                struct sbuf none = { 0 };
                                m = msg_new("assistant", &none, &reasoning);
                                if ((ret = conv_append(conv, m, e)) < 0)
                                        break;
                        }
                        json_t *calls = json_object_get(m, "tool_calls");
                        if (!calls) {
                                calls = json_array();
                                json_object_set_new(m, "tool_calls", calls);
                        }
                        if (json_array_size(calls) >= API_MAX_TOOL_CALLS) {
                                ret = api_bad(e, p, "at most %d calls in a row", API_MAX_TOOL_CALLS);
                                break;
                        }
                        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", call_id, "type",
                                                               "function", "function", "name", name, "arguments", args));
                        json_object_set_new(names, call_id, json_string(name));
                } else if (streq(type, "function_call_output") || streq(type, "custom_tool_call_output")) {
                        const char *call_id = json_string_value(json_object_get(it, "call_id"));
                        if (!call_id) {
                                snprintf(q, sizeof q, "%s.call_id", p);
                                ret = api_bad(e, q, "required (the call_id of the function_call it answers)");
                                break;
                        }
                        struct sbuf text = { 0 };
                        if ((ret = item_text(it, p, "output", &text, e)) < 0)
                                break;
                        json_t *m = msg_new("tool", &text, NULL);
                        const char *name = json_string_value(json_object_get(names, call_id));
                        if (m && name)
                                json_object_set_new(m, "name", json_string(name));
                        if ((ret = conv_append(conv, m, e)) < 0)
                                break;
                } else if (streq(type, "reasoning")) {
                        /* its text: from an encrypted_content of ours, else its content, else its
                         * summary (another server's encrypted_content is not readable here) */
                        int ours = restore_reasoning(it, p, &reasoning, e);
                        if (ours < 0) {
                                ret = -1;
                                break;
                        }
                        if (ours)
                                continue;
                        json_t *parts = json_object_get(it, "content");
                        if (!json_is_array(parts) || json_array_size(parts) == 0)
                                parts = json_object_get(it, "summary");
                        size_t k;
                        json_t *part;
                        json_array_foreach(parts, k, part) {
                                json_t *t = json_object_get(part, "text");
                                if (!json_is_string(t))
                                        continue;
                                if ((reasoning.len && sbuf_add(&reasoning, "\n", 1) < 0) ||
                                    sbuf_add_text(&reasoning, json_string_value(t), json_string_length(t)) < 0) {
                                        ret = OOM(e);
                                        break;
                                }
                        }
                        if (ret < 0)
                                break;
                } else if (streq(type, "input_image") || streq(type, "input_file") || streq(type, "input_audio")) {
                        ret = api_fail(e, 400, "invalid_request_error", "unsupported_content_type", p,
                                       "%s: \"%s\" is not supported; xing4d's model reads text only", p, type);
                        break;
                } else {
                        snprintf(q, sizeof q, "%s.type", p);
                        ret = api_fail(e, 400, "invalid_request_error", "unsupported_value", q,
                                       "%s: item type \"%s\" is not supported (message, function_call, "
                                       "function_call_output, custom_tool_call, custom_tool_call_output and "
                                       "reasoning are)", q, type);
                        break;
                }
        }
        free(reasoning.s);
        return ret;
}

static const char *const hosted_tools[] = { "web_search", "file_search", "code_interpreter", "computer_use_preview",
                                             "computer_use", "image_generation", "mcp", "local_shell", "shell",
                                             "apply_patch", "namespace" };

/* tools[i].name, a non-empty string; NULL with e filled when it is not. */
static json_t *tool_name(json_t *t, size_t i, struct api_error *e) {
        char p[64];
        json_t *name = json_object_get(t, "name");
        if (json_is_string(name) && json_string_length(name) > 0)
                return name;
        snprintf(p, sizeof p, "tools[%zu].name", i);
        api_bad(e, p, "required (a non-empty string)");
        return NULL;
}

/* A custom tool (free-form text input, e.g. Codex's apply_patch) as the function the model is
 * offered: one string argument, `input`; its grammar, when it has one, is told in the description
 * (the mask does not enforce Lark or regex grammars). The call comes back as a custom_tool_call
 * item carrying that string (custom_input). */
static int custom_tool(json_t *t, size_t i, json_t *list, struct api_error *e) {
        char p[64];
        json_t *name = tool_name(t, i, e), *desc = json_object_get(t, "description");
        json_t *fmt = json_object_get(t, "format");
        if (!name)
                return -1;
        snprintf(p, sizeof p, "tools[%zu].description", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
                return api_bad(e, p, "a string expected, got %s", api_type_name(desc));
        const char *ftype = json_string_value(json_object_get(fmt, "type"));
        json_t *def = json_object_get(fmt, "definition"), *syntax = json_object_get(fmt, "syntax");
        snprintf(p, sizeof p, "tools[%zu].format", i);
        if (fmt && !json_is_null(fmt) && (!json_is_object(fmt) || !(streq(ftype, "text") || streq(ftype, "grammar"))))
                return api_bad(e, p, "{\"type\": \"text\"} or {\"type\": \"grammar\", \"syntax\", \"definition\"} expected");
        snprintf(p, sizeof p, "tools[%zu].format.definition", i);
        if (def && !json_is_null(def) && !json_is_string(def))
                return api_bad(e, p, "a string expected, got %s", api_type_name(def));
        snprintf(p, sizeof p, "tools[%zu].format.syntax", i);
        if (syntax && !json_is_null(syntax) && !streq(json_string_value(syntax), "lark") &&
            !streq(json_string_value(syntax), "regex"))
                return api_bad(e, p, "\"lark\" or \"regex\" expected");
        struct sbuf d = { 0 };
        int ret = 0;
        if (json_is_string(desc))
                ret = sbuf_add(&d, json_string_value(desc), strlen(json_string_value(desc)));
        if (ret == 0 && json_is_string(def)) {
                char head[96];
                int n = snprintf(head, sizeof head, "%sThe input follows this %s grammar:\n", d.len ? "\n\n" : "",
                                 json_is_string(syntax) ? json_string_value(syntax) : "");
                ret = sbuf_add(&d, head, (size_t) n) < 0 || sbuf_add(&d, json_string_value(def), strlen(json_string_value(def))) < 0
                              ? -1 : 0;
        }
        json_t *fn = ret == 0 ? json_pack("{s:O, s:{s:s, s:{s:{s:s, s:s}}, s:[s], s:b}}", "name", name, "parameters",
                                          "type", "object", "properties", "input", "type", "string", "description",
                                          "The tool's whole input, as free-form text", "required", "input",
                                          "additionalProperties", false)
                              : NULL;
        if (fn && d.s)
                json_object_set_new(fn, "description", json_string(d.s));
        free(d.s);
        if (!fn || json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn)) < 0)
                return OOM(e);
        return 0;
}

/* Whether `name` is one of the request's custom tools (echo: the request's settings, whose
 * "tools" are the request's own): its calls are answered as custom_tool_call items. */
static bool is_custom_tool(json_t *echo, const char *name) {
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(echo, "tools"), i, t)
                if (streq(json_string_value(json_object_get(t, "type")), "custom") &&
                    streq(json_string_value(json_object_get(t, "name")), name))
                        return true;
        return false;
}

/* A custom tool call's input: the string argument `input` of the function it was offered as
 * (custom_tool); another value, as its JSON text; none, the whole arguments text. Malloc'ed. */
static char *custom_input(const char *args) {
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        json_t *in = json_object_get(a, "input");
        char *s = json_is_string(in) ? strdup(json_string_value(in))
                : in ? json_dumps(in, JSON_COMPACT | JSON_ENCODE_ANY) : strdup(args ? args : "");
        json_decref(a);
        return s;
}

/* A custom tool's calls are told from function calls by name: none may share one. */
static int custom_names_unique(json_t *tools, struct api_error *e) {
        _cleanup_(json_decrefp) json_t *seen = json_object(); /* name: the index of the first tool */
        size_t i;
        json_t *t;
        if (!seen)
                return OOM(e);
        json_array_foreach(tools, i, t) {
                const char *type = json_string_value(json_object_get(t, "type"));
                const char *name = json_string_value(json_object_get(t, "name"));
                if (!name || !(streq(type, "custom") || streq(type, "function")))
                        continue;
                json_t *first = json_object_get(seen, name);
                if (first && (streq(type, "custom") ||
                              streq(json_string_value(json_object_get(json_array_get(tools, (size_t) json_integer_value(first)),
                                                                      "type")), "custom"))) {
                        char p[64];
                        snprintf(p, sizeof p, "tools[%zu].name", i);
                        return api_bad(e, p, "\"%s\" is also the name of tools[%lld]; a custom tool's name must be its "
                                       "own", name, (long long) json_integer_value(first));
                }
                if (!first && json_object_set_new(seen, name, json_integer((json_int_t) i)) < 0)
                        return OOM(e);
        }
        return 0;
}

static int parse_tools(json_t *root, json_t **out, struct api_error *e) {
        json_t *tools, *list;
        size_t i;
        json_t *t;
        if (api_tools_begin(root, "an array of {type: \"function\", name, parameters} expected", &tools, out,
                            e) < 0)
                return -1;
        if (!tools)
                return 0;
        list = *out;
        json_array_foreach(tools, i, t) {
                char p[64];
                snprintf(p, sizeof p, "tools[%zu].type", i);
                const char *type = json_string_value(json_object_get(t, "type"));
                if (!json_is_object(t) || !type)
                        return api_bad(e, p, "required (\"function\" or \"custom\")");
                if (streq(type, "custom")) {
                        if (custom_tool(t, i, list, e) < 0)
                                return -1;
                        continue;
                }
                if (!streq(type, "function")) {
                        /* tools OpenAI's servers run (or that need its namespaces): agents such
                         * as Codex always send some; the model is offered the function and custom
                         * tools only */
                        bool hosted = false;
                        for (size_t k = 0; k < ELEMENTSOF(hosted_tools); k++)
                                hosted = hosted || streq(type, hosted_tools[k]) ||
                                         strncmp(type, "web_search_preview", 18) == 0;
                        if (hosted)
                                continue;
                        return api_fail(e, 400, "invalid_request_error", "unsupported_tool", p,
                                        "%s: unknown tool type \"%s\"; function and custom tools are offered to the "
                                        "model, OpenAI-hosted ones (web_search, file_search, ...) are left out", p, type);
                }
                json_t *name = tool_name(t, i, e);
                json_t *params = json_object_get(t, "parameters");
                json_t *desc = json_object_get(t, "description");
                if (!name)
                        return -1;
                snprintf(p, sizeof p, "tools[%zu].parameters", i);
                if (params && !json_is_null(params) && !json_is_object(params))
                        return api_bad(e, p, "a JSON Schema object expected, got %s", api_type_name(params));
                json_t *fn = json_pack("{s:O}", "name", name);
                if (fn && json_is_object(params))
                        json_object_set(fn, "parameters", params);
                if (fn && json_is_string(desc))
                        json_object_set(fn, "description", desc);
                /* "strict": true said outright (the API's default is not taken: agents send
                 * schemas written for validation without it): held to the schema exactly */
                if (fn && json_is_true(json_object_get(t, "strict")))
                        json_object_set_new(fn, "strict", json_true());
                if (!fn || json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn)) < 0)
                        return OOM(e);
        }
        return custom_names_unique(tools, e);
}

static int parse_tool_choice(json_t *root, json_t *tools, bool *send, struct api_request *r, struct api_error *e) {
        json_t *tc = json_object_get(root, "tool_choice");
        const char *name = NULL;
        if (!tc || json_is_null(tc))
                return 0;
        if (json_is_string(tc)) {
                const char *c = json_string_value(tc);
                if (streq(c, "auto"))
                        return 0;
                if (streq(c, "none")) {
                        /* the tools stay in the prompt, a call is answered as text (api_call_text) */
                        r->no_calls = true;
                        return 0;
                }
                if (!streq(c, "required"))
                        return api_bad(e, "tool_choice", "\"%s\": \"none\", \"auto\", \"required\" or "
                                       "{\"type\": \"function\" or \"custom\", \"name\": ...} expected", c);
        } else if (json_is_object(tc)) {
                const char *type = json_string_value(json_object_get(tc, "type"));
                if (!streq(type, "function") && !streq(type, "custom"))
                        return api_bad(e, "tool_choice.type", "\"function\" or \"custom\" expected");
                name = json_string_value(json_object_get(tc, "name"));
                if (!name || !*name)
                        return api_bad(e, "tool_choice.name", "the name of one of the request's tools expected");
                if (api_tool_named(tools, name, "tool_choice.name", e) < 0)
                        return -1;
                if (is_custom_tool(root, name) != streq(type, "custom"))
                        return api_bad(e, "tool_choice.name", "\"%s\" is not one of the request's %s tools", name,
                                       type);
        } else
                return api_bad(e, "tool_choice", "a string or an object expected, got %s", api_type_name(tc));
        if (!*send)
                return api_bad(e, "tool_choice", "forcing a tool call needs a non-empty \"tools\"");
        return api_force_tool(r, name, e);
}

/* truncation "auto" (OpenAI: items are dropped from the beginning of the conversation until the
 * input fits): the bridge has no tokenizer, so it learns that a prompt is too long from the
 * daemon's refusal, which says by how much (tokens, or bytes before tokenizing). main.c then
 * parses the request again with more of the oldest units left out (api_config.drop_units) and
 * submits it again, until it fits or only the last unit is left. A unit is a message other than
 * a system one with the tool results that follow it, so no result outlives its call; system
 * messages (and instructions) always stay. */
static bool unit_start(json_t *m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        return !streq(role, "system") && !streq(role, "tool");
}

uint64_t rs_message_bytes(json_t *m) {
        json_t *calls = json_object_get(m, "tool_calls");
        _cleanup_free_ char *dump = calls ? json_dumps(calls, JSON_COMPACT) : NULL;
        return json_string_length(json_object_get(m, "content")) + json_string_length(json_object_get(m, "reasoning")) +
               (dump ? strlen(dump) : 0);
}

size_t rs_truncate_plan(json_t *conv, uint64_t excess) {
        size_t units = 0, i;
        json_t *m;
        json_array_foreach(conv, i, m)
                units += unit_start(m);
        size_t n = 0;
        uint64_t shed = 0;
        bool in_unit = false;
        json_array_foreach(conv, i, m) {
                if (unit_start(m)) {
                        if (in_unit && shed >= excess)
                                break;
                        if (n + 1 >= units)
                                break; /* the last unit stays */
                        n++;
                        in_unit = true;
                }
                if (in_unit && !streq(json_string_value(json_object_get(m, "role")), "system"))
                        shed += rs_message_bytes(m);
        }
        return n;
}

/* conv without its first `drop` units (system messages stay where they are). */
static int drop_units(json_t *conv, size_t drop, struct api_error *e) {
        size_t i = 0, dropped = 0;
        while (i < json_array_size(conv)) {
                json_t *m = json_array_get(conv, i);
                const char *role = json_string_value(json_object_get(m, "role"));
                if (unit_start(m)) {
                        if (dropped == drop)
                                return 0;
                        dropped++;
                } else if (streq(role, "system") || dropped == 0) {
                        i++; /* a system message, or a tool result before any unit */
                        continue;
                }
                if (json_array_remove(conv, i) < 0)
                        return OOM(e);
        }
        return 0;
}

/* include: what OpenAI's Responses API can add to an answer. reasoning.encrypted_content is
 * answered (RS_ENCRYPTED); the others name what this bridge never answers (hosted tools' results,
 * images) or, message.output_text.logprobs, what it does not give here: accepted, no effect. */
static const char *const includables[] = { "reasoning.encrypted_content", "message.output_text.logprobs",
                                           "message.input_image.image_url", "computer_call_output.output.image_url",
                                           "file_search_call.results", "web_search_call.results",
                                           "web_search_call.action.sources", "code_interpreter_call.outputs" };

static int parse_include(json_t *root, struct api_request *r, struct api_error *e) {
        json_t *include = json_object_get(root, "include");
        if (!include || json_is_null(include))
                return 0;
        if (!json_is_array(include))
                return api_bad(e, "include", "an array of strings expected, got %s", api_type_name(include));
        size_t i;
        json_t *v;
        json_array_foreach(include, i, v) {
                char p[64];
                snprintf(p, sizeof p, "include[%zu]", i);
                const char *name = json_string_value(v);
                if (!name)
                        return api_bad(e, p, "a string expected, got %s", api_type_name(v));
                size_t k = 0;
                while (k < ELEMENTSOF(includables) && !streq(name, includables[k]))
                        k++;
                if (k == ELEMENTSOF(includables))
                        return api_bad(e, p, "\"%.64s\" is not a value include takes (reasoning.encrypted_content, "
                                       "message.output_text.logprobs, message.input_image.image_url, "
                                       "computer_call_output.output.image_url, file_search_call.results, "
                                       "web_search_call.results, web_search_call.action.sources or "
                                       "code_interpreter_call.outputs)", name);
                if (streq(name, "reasoning.encrypted_content"))
                        r->reasoning_out |= RS_ENCRYPTED;
        }
        return 0;
}

int rs_parse(json_t *root, const struct api_config *cfg, struct api_request *r, struct api_error *e) {
        int key = cfg->key;
        json_int_t iv;
        bool set;
        if (api_get_bool(root, "stream", &r->stream, e) < 0)
                return -1;
        r->store = true;
        if (api_get_bool(root, "store", &r->store, e) < 0)
                return -1;
        bool background = false;
        if (api_get_bool(root, "background", &background, e) < 0)
                return -1;
        if (background)
                return api_unsupported(e, "background", "running a response in the background");
        /* state kept on OpenAI's servers: answering without it would silently drop the history or
         * the instructions the client meant to send */
        json_t *conversation = json_object_get(root, "conversation");
        if (conversation && !json_is_null(conversation))
                return api_unsupported(e, "conversation", "a stored conversation (send previous_response_id, or the "
                                       "history in input)");
        json_t *prompt = json_object_get(root, "prompt");
        if (prompt && !json_is_null(prompt))
                return api_unsupported(e, "prompt", "a stored prompt template (send instructions and input)");
        if (api_get_int(root, "max_output_tokens", 1, UINT32_MAX, &iv, &set, e) < 0)
                return -1;
        if (set)
                x4_request_set_max_tokens(r->req, (uint32_t) iv);
        static const struct api_sampling_param params[] = {
                { "temperature", 0, 2, false, x4_request_set_temperature },
                { "top_p", 0, 1, true, x4_request_set_top_p },
        };
        if (api_get_sampling(root, params, sizeof params / sizeof params[0], r->req, e) < 0)
                return -1;
        bool parallel = true;
        if (api_get_bool(root, "parallel_tool_calls", &parallel, e) < 0)
                return -1;
        r->one_call = !parallel;
        json_t *trunc = json_object_get(root, "truncation");
        if (trunc && !json_is_null(trunc) && !streq(json_string_value(trunc), "auto") &&
            !streq(json_string_value(trunc), "disabled"))
                return api_bad(e, "truncation", "\"auto\" or \"disabled\" expected");
        r->truncate = streq(json_string_value(trunc), "auto");
        json_t *md = json_object_get(root, "metadata");
        if (api_check_metadata(root, e) < 0)
                return -1;
        json_t *instr = json_object_get(root, "instructions");
        if (instr && !json_is_null(instr) && !json_is_string(instr))
                return api_bad(e, "instructions", "a string expected, got %s", api_type_name(instr));

        /* reasoning.effort "none" or "minimal" turns thinking off (as on chat completions); low to
         * xhigh leave it on */
        r->thinking = true;
        json_t *reasoning = json_object_get(root, "reasoning"), *summary = NULL;
        if (reasoning && !json_is_null(reasoning)) {
                if (!json_is_object(reasoning))
                        return api_bad(e, "reasoning", "an object {\"effort\": ...} expected");
                json_t *effort = json_object_get(reasoning, "effort");
                const char *ef = json_string_value(effort);
                if (effort && !json_is_null(effort) && !streq(ef, "none") && !streq(ef, "minimal") &&
                    !streq(ef, "low") && !streq(ef, "medium") && !streq(ef, "high") && !streq(ef, "xhigh"))
                        return api_bad(e, "reasoning.effort", "\"none\", \"minimal\", \"low\", \"medium\", \"high\" "
                                       "or \"xhigh\" expected");
                if (streq(ef, "none") || streq(ef, "minimal")) {
                        r->thinking = false;
                        x4_request_set_thinking(r->req, false);
                }
                /* summary (generate_summary, its deprecated name): the reasoning text itself */
                for (size_t k = 0; k < 2; k++) {
                        const char *key = k == 0 ? "summary" : "generate_summary";
                        json_t *v = json_object_get(reasoning, key);
                        const char *sv = json_string_value(v);
                        if (!v || json_is_null(v))
                                continue;
                        if (!streq(sv, "auto") && !streq(sv, "concise") && !streq(sv, "detailed")) {
                                char q[64];
                                snprintf(q, sizeof q, "reasoning.%s", key);
                                return api_bad(e, q, "\"auto\", \"concise\" or \"detailed\" expected");
                        }
                        if (!summary)
                                summary = v;
                        r->reasoning_out |= RS_SUMMARY;
                }
        }
        if (parse_include(root, r, e) < 0)
                return -1;

        json_t *prev = json_object_get(root, "previous_response_id");
        if (!(r->conv = json_array()))
                return OOM(e);
        if (prev && !json_is_null(prev)) {
                if (!json_is_string(prev))
                        return api_bad(e, "previous_response_id", "a string expected, got %s", api_type_name(prev));
                json_t *stored = rs_store_get(json_string_value(prev), key);
                if (!stored)
                        return api_fail(e, 400, "invalid_request_error", "previous_response_not_found",
                                        "previous_response_id",
                                        "previous_response_id: response \"%.100s\" is not stored here (never "
                                        "answered, \"store\": false, or past the store's retention)",
                                        json_string_value(prev));
                /* a copy: the new input may add calls to the stored turn's last message */
                json_t *copy = json_deep_copy(stored);
                if (!copy || json_array_extend(r->conv, copy) < 0) {
                        json_decref(copy);
                        return OOM(e);
                }
                json_decref(copy);
        }
        json_t *input = json_object_get(root, "input");
        if (!input)
                return api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "input",
                                "input: required (a string or an array of input items)");
        r->input = json_incref(input);
        if (parse_input(input, r->conv, e) < 0)
                return -1;
        if (json_array_size(r->conv) == 0)
                return api_bad(e, "input", "a non-empty array expected");
        if (cfg->drop_units && drop_units(r->conv, cfg->drop_units, e) < 0)
                return -1;

        _cleanup_(json_decrefp) json_t *tools = NULL;
        if (parse_tools(root, &tools, e) < 0)
                return -1;
        bool send = tools && json_array_size(tools) > 0;
        if (parse_tool_choice(root, tools, &send, r, e) < 0)
                return -1;
        if (send) {
                _cleanup_free_ char *s = json_dumps(tools, JSON_COMPACT);
                if (!s || x4_request_set_tools_json(r->req, s) < 0)
                        return OOM(e);
        }
        json_t *text = json_object_get(root, "text");
        json_t *format = NULL;
        if (text && !json_is_null(text)) {
                if (!json_is_object(text))
                        return api_bad(e, "text", "an object {\"format\": {...}} expected");
                format = json_object_get(text, "format");
                if (format && !json_is_null(format)) {
                        const char *type = json_string_value(json_object_get(format, "type"));
                        if (!json_is_object(format) || !type)
                                return api_bad(e, "text.format.type", "\"text\", \"json_object\" or \"json_schema\" "
                                               "expected");
                        if (!streq(type, "text") && r->forced_tool)
                                return api_bad(e, "text.format", "a JSON answer cannot be combined with a forced "
                                               "tool call (tool_choice)");
                        /* the Responses API flattens {name, schema, strict} into format itself */
                        if (api_parse_format(type, format, format, "text.format", "text.format", r, e) < 0)
                                return -1;
                }
        }
        /* tool_choice auto (the default with tools): calls the model makes are held to the tools'
         * syntax */
        const char *ft = json_string_value(json_object_get(format, "type"));
        if (send && !r->forced_tool && !r->no_calls &&
            api_auto_tools(r, ft && !streq(ft, "text"), e) < 0)
                return -1;

        /* the system text first, then the conversation */
        if (json_is_string(instr) && json_string_length(instr) > 0) {
                _cleanup_(json_decrefp) json_t *sys = json_pack("[{s:s, s:O}]", "role", "system", "content", instr);
                if (!sys || api_add_conversation(r, sys, e) < 0)
                        return sys ? -1 : OOM(e);
        }
        if (api_add_conversation(r, r->conv, e) < 0)
                return -1;

        /* what the response object says about its request */
        json_t *effort = reasoning ? json_object_get(reasoning, "effort") : NULL;
        json_t *tc = json_object_get(root, "tool_choice");
        json_t *tl = json_object_get(root, "tools");
        json_t *mo = json_object_get(root, "max_output_tokens");
        json_t *temp = json_object_get(root, "temperature"), *top_p = json_object_get(root, "top_p");
        r->echo = json_pack("{s:o, s:o, s:o, s:{s:o, s:o}, s:b, s:b, s:o, s:o, s:{s:o}, s:o, s:o, s:s}",
                            "instructions", json_is_string(instr) ? json_copy(instr) : json_null(),
                            "max_output_tokens", json_is_integer(mo) ? json_copy(mo) : json_null(),
                            "previous_response_id", json_is_string(prev) ? json_copy(prev) : json_null(),
                            "reasoning", "effort", json_is_string(effort) ? json_copy(effort) : json_null(), "summary",
                            summary ? json_copy(summary) : json_null(),
                            "store", r->store, "parallel_tool_calls", parallel,
                            "temperature", json_real(json_is_number(temp) ? json_number_value(temp) : 1.0),
                            "top_p", json_real(json_is_number(top_p) ? json_number_value(top_p) : 1.0),
                            "text", "format", json_is_object(format) ? json_deep_copy(format)
                                                                     : json_pack("{s:s}", "type", "text"),
                            "tool_choice", tc && !json_is_null(tc) ? json_deep_copy(tc) : json_string("auto"),
                            "tools", json_is_array(tl) ? json_deep_copy(tl) : json_array(),
                            "truncation", r->truncate ? "auto" : "disabled");
        if (!r->echo)
                return OOM(e);
        json_object_set_new(r->echo, "metadata", json_is_object(md) ? json_deep_copy(md) : json_object());
        return 0;
}

/* ---- answers ------------------------------------------------------------------------------------- */

static json_t *usage_json(const struct x4_done *d) {
        return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t) d->prompt_tokens,
                         "input_tokens_details", "cached_tokens", (json_int_t) d->cached_tokens, "output_tokens",
                         (json_int_t) d->completion_tokens, "output_tokens_details", "reasoning_tokens",
                         (json_int_t) d->reasoning_tokens, "total_tokens",
                         (json_int_t) d->prompt_tokens + d->completion_tokens);
}

static void item_id(char *buf, size_t size, const char *prefix, const char *id, unsigned index) {
        api_call_id(buf, size, prefix, id, index);
}

/* A finished reasoning item; `out` (RS_SUMMARY, RS_ENCRYPTED) says what it carries besides its
 * content. */
static json_t *reasoning_item(const char *id, const char *text, size_t len, unsigned out) {
        json_t *it = json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}], s:s}", "id", id, "type", "reasoning", "summary",
                               "content", "type", "reasoning_text", "text", text, len, "status", "completed");
        if (it && (out & RS_SUMMARY))
                json_object_set_new(it, "summary",
                                    json_pack("[{s:s, s:s%}]", "type", "summary_text", "text", text, len));
        if (it && (out & RS_ENCRYPTED))
                json_object_set_new(it, "encrypted_content", encrypted_content(text, len));
        return it;
}

static json_t *text_part(const char *text, size_t len) {
        return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", text, len, "annotations", "logprobs");
}

static json_t *message_item(const char *id, const char *text, size_t len, bool done) {
        return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status",
                         done ? "completed" : "in_progress", "role", "assistant", "content",
                         done ? json_pack("[o]", text_part(text, len)) : json_array());
}

static json_t *call_item(const char *id, const char *call_id, const char *name, const char *args, bool done) {
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status",
                         done ? "completed" : "in_progress", "call_id", call_id, "name", name, "arguments", args);
}

static json_t *custom_call_item(const char *id, const char *call_id, const char *name, const char *input, bool done) {
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "custom_tool_call", "status",
                         done ? "completed" : "in_progress", "call_id", call_id, "name", name, "input", input);
}

/* The output item (at output_index `item`) of the answer's call number `call`: a function_call,
 * or a custom_tool_call for a custom tool (its input: custom_input). */
static json_t *output_call_item(const char *id, json_t *echo, unsigned item, size_t call, const char *name,
                                const char *args) {
        char iid[64], cid[64];
        bool custom = is_custom_tool(echo, name);
        item_id(iid, sizeof iid, custom ? "ctc_" : "fc_", id, item);
        api_call_id(cid, sizeof cid, "call_", id, call);
        if (!custom)
                return call_item(iid, cid, name, args, true);
        _cleanup_free_ char *input = custom_input(args);
        return input ? custom_call_item(iid, cid, name, input, true) : NULL;
}

static json_t *response_object(const char *id, int64_t created, const char *model, json_t *echo, json_t *output,
                               const struct x4_done *d) {
        const char *status = !d ? "in_progress" : d->finish_reason == X4_FINISH_LENGTH ? "incomplete"
                : d->finish_reason == X4_FINISH_CANCELLED ? "cancelled" : "completed";
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n, s:o, s:s, s:o, s:o}", "id", id, "object", "response",
                              "created_at", (json_int_t) created, "status", status, "error", "incomplete_details",
                              d && d->finish_reason == X4_FINISH_LENGTH ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                                        : json_null(),
                              "model", model, "output", output, "usage", d ? usage_json(d) : json_null());
        if (o && echo)
                json_object_update_missing(o, echo);
        return o;
}

json_t *rs_response_json(const char *id, int64_t created, const char *model, json_t *echo, unsigned reasoning_out,
                         const struct api_result *res, const struct x4_done *d) {
        json_t *output = json_array();
        unsigned n = 0;
        char iid[64];
        if (res->reasoning) {
                item_id(iid, sizeof iid, "rs_", id, n++);
                json_array_append_new(output, reasoning_item(iid, res->reasoning, res->reasoning_len, reasoning_out));
        }
        if (res->content || (res->n_calls == 0 && !res->reasoning)) {
                item_id(iid, sizeof iid, "msg_", id, n++);
                json_array_append_new(output, message_item(iid, res->content ? res->content : "", res->content_len, true));
        }
        for (size_t i = 0; i < res->n_calls; i++)
                json_array_append_new(output, output_call_item(id, echo, n++, i, res->calls[i].name, res->calls[i].arguments));
        /* cut by max_output_tokens: the text that was being written is incomplete (a call is
         * reported only whole) */
        json_t *last = json_array_get(output, json_array_size(output) - 1);
        if (d && d->finish_reason == X4_FINISH_LENGTH && res->n_calls == 0 && last)
                json_object_set_new(last, "status", json_string("incomplete"));
        return response_object(id, created, model, echo, output, d);
}

/* ---- streaming ----------------------------------------------------------------------------------- */

static void ev(struct ev_stream *s, struct evbuffer *out, const char *type, json_t *data) {
        json_t *o = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t) s->seq++);
        if (!o || !data) {
                json_decref(o);
                json_decref(data);
                return;
        }
        json_object_update(o, data);
        json_decref(data);
        sse_format_event(out, type, o);
}

void rs_stream_start(struct ev_stream *s, struct evbuffer *out) {
        ev(s, out, "response.created",
           json_pack("{s:o}", "response", response_object(s->id, s->created, s->model, s->echo, json_array(), NULL)));
        ev(s, out, "response.in_progress",
           json_pack("{s:o}", "response", response_object(s->id, s->created, s->model, s->echo, json_array(), NULL)));
}

/* The text of the open item so far. */
static const char *open_text(struct ev_stream *s, size_t *len) {
        const char *base = s->open == 1 ? s->res->reasoning : s->res->content;
        size_t all = s->open == 1 ? s->res->reasoning_len : s->res->content_len;
        *len = all - s->open_start;
        return base ? base + s->open_start : "";
}

static void close_item(struct ev_stream *s, struct evbuffer *out) {
        if (!s->open)
                return;
        char iid[64];
        size_t len;
        const char *text = open_text(s, &len);
        item_id(iid, sizeof iid, s->open == 1 ? "rs_" : "msg_", s->id, s->index);
        json_t *item;
        if (s->open == 1) {
                if (s->reasoning_out & RS_SUMMARY) {
                        ev(s, out, "response.reasoning_summary_text.done",
                           json_pack("{s:s, s:i, s:i, s:s%}", "item_id", iid, "output_index", (int) s->index,
                                     "summary_index", 0, "text", text, len));
                        ev(s, out, "response.reasoning_summary_part.done",
                           json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", iid, "output_index", (int) s->index,
                                     "summary_index", 0, "part", "type", "summary_text", "text", text, len));
                }
                ev(s, out, "response.reasoning_text.done",
                   json_pack("{s:s, s:i, s:i, s:s%}", "item_id", iid, "output_index", (int) s->index, "content_index", 0,
                             "text", text, len));
                ev(s, out, "response.content_part.done",
                   json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", iid, "output_index", (int) s->index,
                             "content_index", 0, "part", "type", "reasoning_text", "text", text, len));
                item = reasoning_item(iid, text, len, s->reasoning_out);
        } else {
                ev(s, out, "response.output_text.done",
                   json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", iid, "output_index", (int) s->index,
                             "content_index", 0, "text", text, len, "logprobs"));
                ev(s, out, "response.content_part.done",
                   json_pack("{s:s, s:i, s:i, s:o}", "item_id", iid, "output_index", (int) s->index, "content_index", 0,
                             "part", text_part(text, len)));
                item = message_item(iid, text, len, true);
        }
        if (s->cut) /* the output ended inside it (max_output_tokens, a failure) */
                json_object_set_new(item, "status", json_string("incomplete"));
        ev(s, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", (int) s->index, "item", item));
        json_array_append_new(s->output, item);
        s->index++;
        s->open = 0;
}

void rs_stream_chunk(struct ev_stream *s, const struct x4_chunk *c, struct evbuffer *out) {
        if (c->channel == X4_CHANNEL_TOOL_CALL) {
                if (!c->tool_name)
                        return;
                close_item(s, out);
                const char *args = c->tool_arguments_json ? c->tool_arguments_json : "{}";
                json_t *item = output_call_item(s->id, s->echo, s->index, s->n_calls++, c->tool_name, args);
                if (!item)
                        return;
                const char *iid = json_string_value(json_object_get(item, "id"));
                if (streq(json_string_value(json_object_get(item, "type")), "custom_tool_call")) {
                        /* OpenAI's events of a custom tool call: its input, whole, as one delta */
                        json_t *input = json_object_get(item, "input");
                        ev(s, out, "response.output_item.added",
                           json_pack("{s:i, s:o}", "output_index", (int) s->index, "item",
                                     custom_call_item(iid, json_string_value(json_object_get(item, "call_id")),
                                                      c->tool_name, "", false)));
                        ev(s, out, "response.custom_tool_call_input.delta",
                           json_pack("{s:s, s:i, s:O}", "item_id", iid, "output_index", (int) s->index, "delta", input));
                        ev(s, out, "response.custom_tool_call_input.done",
                           json_pack("{s:s, s:i, s:O}", "item_id", iid, "output_index", (int) s->index, "input", input));
                } else {
                        ev(s, out, "response.output_item.added",
                           json_pack("{s:i, s:o}", "output_index", (int) s->index, "item",
                                     call_item(iid, json_string_value(json_object_get(item, "call_id")), c->tool_name,
                                               "", false)));
                        ev(s, out, "response.function_call_arguments.delta",
                           json_pack("{s:s, s:i, s:s}", "item_id", iid, "output_index", (int) s->index, "delta", args));
                        ev(s, out, "response.function_call_arguments.done",
                           json_pack("{s:s, s:i, s:s, s:s}", "item_id", iid, "output_index", (int) s->index, "name",
                                     c->tool_name, "arguments", args));
                }
                ev(s, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", (int) s->index, "item", item));
                json_array_append_new(s->output, item);
                s->index++;
                return;
        }
        if (!c->text_len)
                return;
        char iid[64];
        int want = c->channel == X4_CHANNEL_REASONING ? 1 : 2;
        if (s->open != want) {
                close_item(s, out);
                s->open = want;
                /* the chunk is in res already: the item starts where it does */
                s->open_start = (want == 1 ? s->res->reasoning_len : s->res->content_len) - c->text_len;
                item_id(iid, sizeof iid, want == 1 ? "rs_" : "msg_", s->id, s->index);
                ev(s, out, "response.output_item.added",
                   json_pack("{s:i, s:o}", "output_index", (int) s->index, "item",
                             want == 1 ? json_pack("{s:s, s:s, s:[], s:[], s:s}", "id", iid, "type", "reasoning",
                                                   "summary", "content", "status", "in_progress")
                                       : message_item(iid, "", 0, false)));
                if (want == 1 && (s->reasoning_out & RS_SUMMARY))
                        ev(s, out, "response.reasoning_summary_part.added",
                           json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", iid, "output_index", (int) s->index,
                                     "summary_index", 0, "part", "type", "summary_text", "text", ""));
                ev(s, out, "response.content_part.added",
                   json_pack("{s:s, s:i, s:i, s:o}", "item_id", iid, "output_index", (int) s->index, "content_index", 0,
                             "part", want == 1 ? json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "")
                                               : text_part("", 0)));
        }
        item_id(iid, sizeof iid, want == 1 ? "rs_" : "msg_", s->id, s->index);
        if (want == 1 && (s->reasoning_out & RS_SUMMARY))
                ev(s, out, "response.reasoning_summary_text.delta",
                   json_pack("{s:s, s:i, s:i, s:s%}", "item_id", iid, "output_index", (int) s->index,
                             "summary_index", 0, "delta", c->text, c->text_len));
        if (want == 1)
                ev(s, out, "response.reasoning_text.delta",
                   json_pack("{s:s, s:i, s:i, s:s%}", "item_id", iid, "output_index", (int) s->index, "content_index", 0,
                             "delta", c->text, c->text_len));
        else
                ev(s, out, "response.output_text.delta",
                   json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", iid, "output_index", (int) s->index,
                             "content_index", 0, "delta", c->text, c->text_len, "logprobs"));
}

void rs_stream_finish(struct ev_stream *s, const struct x4_done *d, struct evbuffer *out) {
        if (s->index == 0 && !s->open) {
                /* nothing was said: the output has one empty message, as rs_response_json gives it,
                 * so a client building the response from the events gets the same items */
                char iid[64];
                item_id(iid, sizeof iid, "msg_", s->id, s->index);
                ev(s, out, "response.output_item.added",
                   json_pack("{s:i, s:o}", "output_index", (int) s->index, "item", message_item(iid, "", 0, false)));
                ev(s, out, "response.content_part.added",
                   json_pack("{s:s, s:i, s:i, s:o}", "item_id", iid, "output_index", (int) s->index, "content_index", 0,
                             "part", text_part("", 0)));
                s->open = 2;
                s->open_start = s->res->content_len;
        }
        s->cut = d->finish_reason == X4_FINISH_LENGTH;
        close_item(s, out);
        ev(s, out, d->finish_reason == X4_FINISH_LENGTH ? "response.incomplete" : "response.completed",
           json_pack("{s:o}", "response", response_object(s->id, s->created, s->model, s->echo,
                                                          json_deep_copy(s->output), d)));
}

/* A stream that fails after its headers: the error event (the SDKs raise on it), then the
 * response failed, after its response.created if none went out yet (clients built on the events,
 * Codex among them, read only response.failed, and the SDKs' stream helpers expect
 * response.created first). An open item ends incomplete. */
void rs_stream_error(struct ev_stream *s, const struct api_error *e, struct evbuffer *out) {
        s->cut = true;
        close_item(s, out);
        ev(s, out, "error",
           json_pack("{s:o, s:s, s:o}", "code", e->code ? json_string(e->code) : json_null(), "message", e->message,
                     "param", e->param[0] ? json_string(e->param) : json_null()));
        json_t *r = response_object(s->id, s->created, s->model, s->echo, json_deep_copy(s->output), NULL);
        if (r) {
                json_object_set_new(r, "status", json_string("failed"));
                json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", e->code ? e->code : "server_error",
                                                          "message", e->message));
        }
        ev(s, out, "response.failed", json_pack("{s:o}", "response", r));
}
