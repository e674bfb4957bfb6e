/* SPDX-License-Identifier: MIT */
/* OpenAI's JSON ⇄ libx4client. Requests are checked here with OpenAI's parameter names, so a bad
 * value is answered as `{"error":{"param":"top_p",...}}` the way the SDKs expect, before anything
 * reaches the daemon (which checks again, with its own field names). */
#include <errno.h>
#include <event2/buffer.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"
#include "common/macro.h"

/* ---- errors ------------------------------------------------------------------------------------ */

/* Messages quote what the client sent (and jansson's parse errors the bytes near the fault), cut
 * to fit: whatever is not well-formed UTF-8 becomes '?', so the error can still be encoded. */
static void utf8_mend(char *s) {
        unsigned char *p = (unsigned char *) s;
        while (*p) {
                size_t n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
                bool ok = n > 0;
                for (size_t i = 1; ok && i < n; i++)
                        ok = (p[i] & 0xC0) == 0x80;
                if (ok && n == 2)
                        ok = *p >= 0xC2;
                if (ok && n == 3) {
                        unsigned cp = (unsigned) (p[0] & 0x0F) << 12 | (unsigned) (p[1] & 0x3F) << 6 | (p[2] & 0x3F);
                        ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
                }
                if (ok && n == 4) {
                        unsigned cp = (unsigned) (p[0] & 0x07) << 18 | (unsigned) (p[1] & 0x3F) << 12 |
                                      (unsigned) (p[2] & 0x3F) << 6 | (p[3] & 0x3F);
                        ok = cp >= 0x10000 && cp <= 0x10FFFF;
                }
                if (!ok) {
                        *p++ = '?';
                        continue;
                }
                p += n;
        }
}

int api_fail(struct api_error *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) {
        va_list ap;
        e->status = status;
        e->type = type;
        e->code = code;
        e->retry_after = 0;
        snprintf(e->param, sizeof e->param, "%s", param ? param : "");
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
        utf8_mend(e->message);
        utf8_mend(e->param);
        return -1;
}

const char *api_anthropic_error_type(int status) {
        switch (status) {
        case 400: case 405: case 415: return "invalid_request_error";
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 413: return "request_too_large";
        case 429: return "rate_limit_error";
        case 503: case 529: return "overloaded_error";
        default: return "api_error";
        }
}

json_t *api_error_json(const struct api_error *e, enum api_flavor flavor) {
        if (flavor == FLAVOR_ANTHROPIC)
                return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                                 api_anthropic_error_type(e->status), "message", e->message);
        return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type,
                         "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                         e->code ? json_string(e->code) : json_null());
}

/* The request field a daemon refusal is about, in the API's own names: the daemon's messages start
 * with the protocol field they refuse ("prompt of N tokens ...", "prompt.chat.messages: ...",
 * "sampling.top_p: ...", "max_tokens: ...", "stop[0]: ..."); NULL when the refusal names none. */
static const char *x4_refusal_param(enum api_kind kind, const char *msg) {
        static const struct {
                const char *prefix, *chat, *completion, *responses;
        } map[] = {
                { "prompt", "messages", "prompt", "input" },
                { "max_tokens", "max_tokens", "max_tokens", "max_output_tokens" },
                { "stop", "stop", "stop", NULL },
                { "logprobs", "top_logprobs", "logprobs", NULL },
                { "thinking_budget", "thinking_budget", NULL, "reasoning" },
                { "constraint.tool", "tool_choice", NULL, "tool_choice" },
                { "constraint", "response_format", NULL, "text.format" },
        };
        static const char *const sampling[] = { "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                                "frequency_penalty", "repetition_penalty", "seed" };
        if (!msg)
                return NULL;
        if (strncmp(msg, "sampling.", 9) == 0) {
                for (size_t i = 0; i < sizeof sampling / sizeof *sampling; i++) {
                        size_t n = strlen(sampling[i]);
                        if (strncmp(msg + 9, sampling[i], n) == 0 && (msg[9 + n] == ':' || msg[9 + n] == ' '))
                                return kind == API_MESSAGES || kind == API_COUNT_TOKENS ? NULL : sampling[i];
                }
                return NULL;
        }
        for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
                size_t n = strlen(map[i].prefix);
                if (strncmp(msg, map[i].prefix, n) != 0 || !msg[n] || !strchr(" .:[", msg[n]))
                        continue;
                return kind == API_CHAT ? map[i].chat
                        : kind == API_COMPLETION ? map[i].completion
                        : kind == API_RESPONSES ? map[i].responses
                        : NULL; /* Anthropic's errors have no param */
        }
        return NULL;
}

void api_error_from_x4(struct api_error *e, enum api_kind kind, int st, const char *msg) {
        if (!msg || !*msg)
                msg = x4_strerror(st);
        const char *param = x4_refusal_param(kind, msg);
        switch (st) {
        case X4_E_INVALID_ARGUMENT:
                api_fail(e, 400, "invalid_request_error", param ? "invalid_value" : NULL, param, "%s", msg);
                break;
        case X4_E_TOO_LARGE: {
                /* Anthropic's wording, which clients match to compact or trim a conversation
                 * (Claude Code, LiteLLM): "prompt is too long: N tokens > M maximum" */
                unsigned n, limit;
                unsigned long long bytes, most;
                char what[16];
                if ((kind == API_MESSAGES || kind == API_COUNT_TOKENS) &&
                    sscanf(msg, "prompt of %u tokens leaves no room for output in the context limit of %u",
                           &n, &limit) == 2 && limit > 0) {
                        api_fail(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                                 "prompt is too long: %u tokens > %u maximum (the model's context is %u tokens, "
                                 "at least one of them for the answer)", n, limit - 1, limit);
                        break;
                }
                /* refused by its size before tokenizing: no token is longer than most / limit
                 * bytes, so the prompt has at least bytes · limit / most tokens */
                if ((kind == API_MESSAGES || kind == API_COUNT_TOKENS) &&
                    sscanf(msg, "prompt.%15[a-z]: %llu bytes cannot fit the context limit of %u tokens (at most %llu",
                           what, &bytes, &limit, &most) == 4 && limit > 0) {
                        api_fail(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                                 "prompt is too long: %llu tokens > %u maximum (at least that many: %llu bytes, "
                                 "at most %llu fit the model's context of %u tokens)",
                                 most ? bytes * limit / most : (unsigned long long) limit, limit - 1, bytes,
                                 most, limit);
                        break;
                }
                api_fail(e, 400, "invalid_request_error", "context_length_exceeded",
                         param ? param : kind == API_COMPLETION ? "prompt" : kind == API_RESPONSES ? "input"
                                                                                             : "messages",
                         "%s", msg);
                break;
        }
        case X4_E_RESOURCE_EXHAUSTED:
                api_fail(e, 400, "invalid_request_error", "context_length_exceeded", param, "%s", msg);
                break;
        case X4_E_NOT_FOUND:
                api_fail(e, 404, "invalid_request_error", "not_found", NULL, "%s", msg);
                break;
        case X4_E_UNIMPLEMENTED:
                api_fail(e, 400, "invalid_request_error", "unsupported", NULL, "%s", msg);
                break;
        case X4_E_UNAVAILABLE:
                api_fail(e, 503, "server_error", "unavailable", NULL, "xing4d is not taking requests: %s", msg);
                e->retry_after = 1;
                break;
        case X4_E_CONNECT:
        case X4_E_TIMEOUT:
        case X4_E_IO:
        case X4_E_CLOSED:
                api_fail(e, 503, "server_error", "daemon_unreachable", NULL, "xing4d is unreachable: %s", msg);
                e->retry_after = 2;
                break;
        default:
                api_fail(e, 500, "server_error", "internal_error", NULL, "%s", msg);
                break;
        }
}

/* ---- request parsing ----------------------------------------------------------------------------- */

void api_request_done(struct api_request *r) {
        x4_request_free(r->req);
        free(r->affinity_key);
        free(r->model);
        json_decref(r->conv);
        json_decref(r->echo);
        json_decref(r->input);
        r->req = NULL;
        r->affinity_key = NULL;
        r->model = NULL;
        r->conv = r->echo = r->input = NULL;
}

int api_bad(struct api_error *e, const char *param, const char *fmt, ...) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return api_fail(e, 400, "invalid_request_error", "invalid_value", param, "%s: %s", param, msg);
}

int api_unsupported(struct api_error *e, const char *param, const char *what) {
        return api_fail(e, 400, "invalid_request_error", "unsupported_parameter", param,
                        "%s: %s is not supported by xing4d", param, what);
}

const char *api_type_name(const json_t *v) {
        switch (json_typeof(v)) {
        case JSON_OBJECT: return "an object";
        case JSON_ARRAY: return "an array";
        case JSON_STRING: return "a string";
        case JSON_INTEGER: return "an integer";
        case JSON_REAL: return "a number";
        case JSON_TRUE:
        case JSON_FALSE: return "a boolean";
        default: return "null";
        }
}

/* A number field within [lo, hi]; absent or null: *set = false. */
/* The member of o a key names: a dotted key ("stream_options.include_usage") is looked up by its
 * last part in o (the sub-object) and named whole in errors. */
static json_t *member(json_t *o, const char *key) {
        const char *leaf = strrchr(key, '.');
        return json_object_get(o, leaf ? leaf + 1 : key);
}

int api_get_number(json_t *o, const char *key, double lo, double hi, bool lo_open, double *v,
                      bool *set, struct api_error *e) {
        json_t *x = member(o, key);
        *set = false;
        if (!x || json_is_null(x))
                return 0;
        if (!json_is_number(x))
                return api_bad(e, key, "a number expected, got %s", api_type_name(x));
        *v = json_number_value(x);
        if (!isfinite(*v) || *v > hi || (lo_open ? *v <= lo : *v < lo))
                return api_bad(e, key, "%g is out of range %s%g, %g]", *v, lo_open ? "(" : "[", lo, hi);
        *set = true;
        return 0;
}

int api_get_sampling(json_t *o, const struct api_sampling_param *p, size_t n, x4_request *req,
                     struct api_error *e) {
        for (size_t i = 0; i < n; i++) {
                double v;
                bool set;
                json_t *x = json_object_get(o, p[i].key);
                /* top_p 0 keeps only the most likely token (OpenAI and Anthropic accept [0, 1];
                 * clients send 0 for greedy output): top_k 1 (an explicit top_k still wins) */
                if (p[i].set == x4_request_set_top_p && json_is_number(x) && json_number_value(x) == 0) {
                        x4_request_set_top_k(req, 1);
                        continue;
                }
                if (api_get_number(o, p[i].key, p[i].lo, p[i].hi, p[i].lo_open, &v, &set, e) < 0)
                        return -1;
                if (set)
                        p[i].set(req, (float) v);
        }
        return 0;
}

int api_tools_begin(json_t *root, const char *expected, json_t **tools, json_t **out, struct api_error *e) {
        json_t *t = json_object_get(root, "tools");
        *tools = *out = NULL;
        if (!t || json_is_null(t))
                return 0;
        if (!json_is_array(t))
                return api_bad(e, "tools", "%s", expected);
        if (!(*out = json_array()))
                return OOM(e);
        *tools = t;
        return 0;
}

int api_tool_named(json_t *tools, const char *name, const char *param, struct api_error *e) {
        bool found = false;
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t)
                found = found || streq(name, json_string_value(json_object_get(json_object_get(t, "function"), "name")));
        return found ? 0 : api_bad(e, param, "\"%s\" is not one of the request's tools", name);
}

/* tool_choice "none" keeps the tools in the prompt (vLLM's default; Anthropic's prompt has them
 * too): the model sees the same prompt in every turn, and the daemon's prefix cache serves it. The
 * daemon still parses a call of an offered tool, so a call written anyway becomes this text, as
 * a server that runs no tool parser for such a request answers it. */
char *api_call_text(const char *name, const char *args) {
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        json_t *call = json_pack("{s:s, s:o}", "name", name ? name : "", "arguments", a ? a : json_object());
        char *body = call ? json_dumps(call, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        char *text = NULL;
        json_decref(call);
        if (body && asprintf(&text, "<tool_call>%s</tool_call>", body) < 0)
                text = NULL;
        free(body);
        return text;
}

/* A forced call: its arguments follow the tool's parameters schema in structure; the keywords
 * the mask cannot enforce (bounds, pattern, formats: MCP and Pydantic schemas carry them, written
 * for validation) are ignored rather than refused (lenient), as the client validates anyway; the
 * daemon holds a tool marked "strict": true to its schema exactly all the same. */
int api_force_tool(struct api_request *r, const char *name, struct api_error *e) {
        r->forced_tool = true;
        if (x4_request_set_constraint(r->req, X4_CONSTRAINT_TOOL, name) < 0 ||
            x4_request_set_constraint_lenient(r->req, true) < 0)
                return OOM(e);
        return 0;
}

int api_auto_tools(struct api_request *r, bool json_answer, struct api_error *e) {
        /* beside a JSON answer: that JSON or tool calls, chosen at the answer's first token (the
         * format's own constraint and strictness stay; non-strict tools are lenient) */
        if (json_answer)
                return x4_request_set_constraint_or_tool_calls(r->req, true) < 0 ? OOM(e) : 0;
        if (x4_request_set_constraint(r->req, X4_CONSTRAINT_TOOL_CALLS, NULL) < 0 ||
            x4_request_set_constraint_lenient(r->req, true) < 0)
                return OOM(e);
        return 0;
}

int api_get_messages(json_t *root, json_t **msgs, struct api_error *e) {
        json_t *m = json_object_get(root, "messages");
        if (!m)
                return api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                                "messages: required (an array of {role, content} objects)");
        if (!json_is_array(m) || json_array_size(m) == 0)
                return api_bad(e, "messages", "a non-empty array expected");
        if (json_array_size(m) > API_MAX_MESSAGES)
                return api_bad(e, "messages", "at most %d messages per request, got %zu", API_MAX_MESSAGES,
                               json_array_size(m));
        *msgs = m;
        return 0;
}

int api_check_metadata(json_t *root, struct api_error *e) {
        json_t *md = json_object_get(root, "metadata");
        if (md && !json_is_null(md) && !json_is_object(md))
                return api_bad(e, "metadata", "an object expected, got %s", api_type_name(md));
        return 0;
}

int api_get_top_k(json_t *o, x4_request *req, struct api_error *e) {
        json_int_t iv;
        bool set;
        if (api_get_int(o, "top_k", 0, 1 << 30, &iv, &set, e) < 0)
                return -1;
        if (set)
                x4_request_set_top_k(req, (uint32_t) iv);
        return 0;
}

int api_get_int(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *v, bool *set,
                   struct api_error *e) {
        json_t *x = member(o, key);
        *set = false;
        if (!x || json_is_null(x))
                return 0;
        if (!json_is_integer(x))
                return api_bad(e, key, "an integer expected, got %s", api_type_name(x));
        *v = json_integer_value(x);
        if (*v < lo || *v > hi)
                return api_bad(e, key, "%lld is out of range [%lld, %lld]", (long long) *v, (long long) lo,
                           (long long) hi);
        *set = true;
        return 0;
}

int api_get_bool(json_t *o, const char *key, bool *v, struct api_error *e) {
        json_t *x = member(o, key);
        if (!x || json_is_null(x))
                return 0;
        if (!json_is_boolean(x))
                return api_bad(e, key, "true or false expected, got %s", api_type_name(x));
        *v = json_is_true(x);
        return 0;
}

int sbuf_add(struct sbuf *b, const char *s, size_t n) {
        if (b->len + n + 1 > b->cap) {
                size_t cap = b->cap ? b->cap * 2 : 256;
                while (cap < b->len + n + 1)
                        cap *= 2;
                char *p = realloc(b->s, cap);
                if (!p)
                        return -1;
                b->s = p;
                b->cap = cap;
        }
        memcpy(b->s + b->len, s, n);
        b->len += n;
        b->s[b->len] = 0;
        return 0;
}

int sbuf_add_text(struct sbuf *b, const char *s, size_t n) {
        static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */
        const char *nul;
        while (n > 0 && (nul = memchr(s, 0, n))) {
                size_t k = (size_t) (nul - s);
                if (sbuf_add(b, s, k) < 0 || sbuf_add(b, replacement, 3) < 0)
                        return -1;
                s += k + 1;
                n -= k + 1;
        }
        return sbuf_add(b, s, n);
}

/* Message content: a string, null, or an array of parts of which only "text" ones are accepted
 * (the model reads text only). */
static int content_text(json_t *content, size_t msg, struct sbuf *out, struct api_error *e) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu].content", msg);
        if (!content || json_is_null(content))
                return 0;
        if (json_is_string(content))
                return sbuf_add_text(out, json_string_value(content), json_string_length(content));
        if (!json_is_array(content))
                return api_bad(e, param, "a string or an array of content parts expected, got %s",
                           api_type_name(content));
        size_t i;
        json_t *part;
        json_array_foreach(content, i, part) {
                snprintf(param, sizeof param, "messages[%zu].content[%zu]", msg, i);
                const char *type = json_string_value(json_object_get(part, "type"));
                if (!json_is_object(part) || !type)
                        return api_bad(e, param, "an object with a \"type\" expected");
                /* an assistant's refusal part (the SDKs replay it) is its text */
                bool refusal = streq(type, "refusal");
                if (strcmp(type, "text") != 0 && !refusal)
                        return api_fail(e, 400, "invalid_request_error", "unsupported_content_type", param,
                                        "%s: content part type \"%s\" is not supported; the model reads "
                                        "\"text\" parts only", param, type);
                json_t *t = json_object_get(part, refusal ? "refusal" : "text");
                if (!json_is_string(t))
                        return api_bad(e, param, "\"%s\" must be a string", refusal ? "refusal" : "text");
                if (sbuf_add_text(out, json_string_value(t), json_string_length(t)) < 0)
                        return -1;
        }
        return 0;
}

/* An assistant message's earlier tool calls, checked and passed on as OpenAI's JSON array
 * ({"id", "type", "function": {"name", "arguments"}}) in ChatMessage.tool_calls_json: the daemon
 * hands them to the chat template, after turning JSON-text arguments into objects, so the model
 * sees its own call syntax (docs/model.md §7). Returns a malloc'ed compact dump, NULL with *e set. */
static char *tool_calls_json(json_t *calls, size_t msg, struct api_error *e) {
        char param[64];
        size_t i;
        json_t *tc;
        snprintf(param, sizeof param, "messages[%zu].tool_calls", msg);
        if (!json_is_array(calls)) {
                api_bad(e, param, "an array expected, got %s", api_type_name(calls));
                return NULL;
        }
        if (json_array_size(calls) > API_MAX_TOOL_CALLS) {
                api_bad(e, param, "at most %d tool calls per message, got %zu", API_MAX_TOOL_CALLS,
                    json_array_size(calls));
                return NULL;
        }
        json_array_foreach(calls, i, tc) {
                json_t *fn = json_object_get(tc, "function");
                json_t *args = json_object_get(fn, "arguments");
                if (!json_is_string(json_object_get(fn, "name"))) {
                        api_bad(e, param, "entry %zu has no function.name", i);
                        return NULL;
                }
                if (args && !json_is_null(args) && !json_is_string(args) && !json_is_object(args)) {
                        api_bad(e, param, "entry %zu: function.arguments must be a JSON string or an object, "
                            "got %s", i, api_type_name(args));
                        return NULL;
                }
        }
        char *s = json_dumps(calls, JSON_COMPACT);
        if (!s)
                OOM(e);
        return s;
}

/* Remember the function name of each of an assistant message's calls by id, so a later tool
 * message's tool_call_id finds its call's name with one hash lookup. (Scanning every earlier
 * message per tool message was quadratic: with the body limit's worth of calls it held the one
 * event loop for minutes.) A later message's call with the same id wins, as does the first of
 * one message's calls, which is what the template sees nearest to the answer. */
static int tool_names_add(json_t *names, json_t *calls) {
        for (size_t i = json_array_size(calls); i-- > 0;) {
                json_t *tc = json_array_get(calls, i);
                const char *id = json_string_value(json_object_get(tc, "id"));
                json_t *name = json_object_get(json_object_get(tc, "function"), "name");
                if (id && json_is_string(name) && json_object_set(names, id, name) < 0)
                        return -1;
        }
        return 0;
}

void api_affinity_add(struct api_request *r, const char *s, size_t n) {
        /* the first 256 bytes of the prompt decide which daemon probably has it cached */
        const size_t max = 256;
        if (r->affinity_len >= max)
                return;
        if (!r->affinity_key && !(r->affinity_key = calloc(1, max + 1)))
                return;
        n = n < max - r->affinity_len ? n : max - r->affinity_len;
        memcpy(r->affinity_key + r->affinity_len, s, n);
        r->affinity_len += n;
}

static int parse_messages(json_t *root, struct api_request *r, struct api_error *e) {
        json_t *msgs;
        size_t i;
        json_t *m;
        if (api_get_messages(root, &msgs, e) < 0)
                return -1;
        _cleanup_(json_decrefp) json_t *tool_names = json_object();
        if (!tool_names)
                return OOM(e);
        json_array_foreach(msgs, i, m) {
                char param[64];
                snprintf(param, sizeof param, "messages[%zu].role", i);
                const char *role = json_string_value(json_object_get(m, "role"));
                if (!json_is_object(m) || !role)
                        return api_bad(e, param, "required (system, developer, user, assistant or tool)");
                if (strcmp(role, "developer") == 0)
                        role = "system";
                if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
                    strcmp(role, "assistant") != 0 && strcmp(role, "tool") != 0)
                        return api_bad(e, param, "\"%s\" is not a role; system, developer, user, assistant or "
                                   "tool expected", role);
                struct sbuf text = { 0 };
                _cleanup_free_ char *calls_json = NULL;
                const char *reasoning = NULL, *name = NULL;
                int ret = content_text(json_object_get(m, "content"), i, &text, e);
                json_t *calls = json_object_get(m, "tool_calls");
                if (ret == 0 && strcmp(role, "assistant") == 0) {
                        /* earlier reasoning: DeepSeek/vLLM's reasoning_content, or reasoning */
                        json_t *rs = json_object_get(m, "reasoning_content");
                        if (!json_is_string(rs))
                                rs = json_object_get(m, "reasoning");
                        reasoning = json_string_value(rs);
                        if (calls && !json_is_null(calls) && !(calls_json = tool_calls_json(calls, i, e)))
                                ret = -1;
                        else if (calls && tool_names_add(tool_names, calls) < 0)
                                ret = -1;
                }
                if (ret == 0 && strcmp(role, "tool") == 0) {
                        /* the protocol has no tool_call_id; the name of the call it answers does */
                        name = json_string_value(json_object_get(m, "name"));
                        const char *id = json_string_value(json_object_get(m, "tool_call_id"));
                        if (!name && id)
                                name = json_string_value(json_object_get(tool_names, id));
                }
                if (ret == 0 && !text.s)
                        ret = sbuf_add(&text, "", 0);
                if (ret < 0) {
                        free(text.s);
                        if (e->status == 0)
                                OOM(e);
                        return -1;
                }
                api_affinity_add(r, text.s, text.len);
                if (calls_json)
                        api_affinity_add(r, calls_json, strlen(calls_json));
                ret = x4_request_add_message_ex(r->req, role, text.s, reasoning, calls_json, name);
                free(text.s);
                if (ret < 0)
                        return OOM(e);
        }
        return 0;
}

static int parse_stop(json_t *root, x4_request *req, struct api_error *e) {
        json_t *stop = json_object_get(root, "stop");
        if (!stop || json_is_null(stop))
                return 0;
        if (json_is_string(stop)) {
                if (json_string_length(stop) == 0)
                        return api_bad(e, "stop", "an empty stop string would match everywhere");
                return x4_request_add_stop(req, json_string_value(stop)) < 0 ? api_bad(e, "stop", "out of memory") : 0;
        }
        if (!json_is_array(stop))
                return api_bad(e, "stop", "a string or an array of up to 4 strings expected, got %s", api_type_name(stop));
        if (json_array_size(stop) > 4)
                return api_bad(e, "stop", "at most 4 stop strings, got %zu", json_array_size(stop));
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) {
                if (!json_is_string(s) || json_string_length(s) == 0)
                        return api_bad(e, "stop", "entry %zu: a non-empty string expected", i);
                if (x4_request_add_stop(req, json_string_value(s)) < 0)
                        return api_bad(e, "stop", "out of memory");
        }
        return 0;
}

static int parse_sampling(json_t *root, struct api_request *r, struct api_error *e) {
        static const struct api_sampling_param params[] = {
                { "temperature", 0, 2, false, x4_request_set_temperature },
                { "top_p", 0, 1, true, x4_request_set_top_p },
                { "min_p", 0, 1, false, x4_request_set_min_p },
                { "presence_penalty", -2, 2, false, x4_request_set_presence_penalty },
                { "frequency_penalty", -2, 2, false, x4_request_set_frequency_penalty },
                { "repetition_penalty", 0, 10, true, x4_request_set_repetition_penalty },
        };
        json_int_t iv;
        bool set;
        if (api_get_sampling(root, params, sizeof params / sizeof params[0], r->req, e) < 0 ||
            api_get_top_k(root, r->req, e) < 0)
                return -1;
        json_t *seed = json_object_get(root, "seed");
        if (seed && !json_is_null(seed)) {
                if (!json_is_integer(seed))
                        return api_bad(e, "seed", "an integer expected, got %s", api_type_name(seed));
                x4_request_set_seed(r->req, (uint64_t) json_integer_value(seed));
        }
        /* max_completion_tokens is the newer name; both accepted, the newer wins */
        json_int_t max = 0;
        bool has_max = false;
        if (api_get_int(root, "max_tokens", 1, UINT32_MAX, &iv, &set, e) < 0)
                return -1;
        if (set)
                max = iv, has_max = true;
        if (api_get_int(root, "max_completion_tokens", 1, UINT32_MAX, &iv, &set, e) < 0)
                return -1;
        if (set)
                max = iv, has_max = true;
        if (has_max)
                x4_request_set_max_tokens(r->req, (uint32_t) max);
        if (api_get_int(root, "n", 1, 1 << 20, &iv, &set, e) < 0)
                return -1;
        if (set && iv != 1)
                return api_fail(e, 400, "invalid_request_error", "unsupported_value", "n",
                                "n: only 1 choice per request is supported, got %lld (send %lld "
                                "requests instead)", (long long) iv, (long long) iv);
        /* logit_bias changes what is sampled: ignoring it would answer a different request (an empty
         * map, which some clients send by default, changes nothing) */
        json_t *lb = json_object_get(root, "logit_bias");
        if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
                return api_unsupported(e, "logit_bias", "biasing token logits");
        /* web search is a tool OpenAI's servers run (refused by name in tools too); even {} turns it
         * on, so only null passes */
        json_t *ws = json_object_get(root, "web_search_options");
        if (ws && !json_is_null(ws))
                return api_unsupported(e, "web_search_options",
                                       "web search (it runs on OpenAI's servers; offer a search function in "
                                       "tools instead)");
        json_t *user = json_object_get(root, "user");
        if (user && !json_is_null(user) && !json_is_string(user))
                return api_bad(e, "user", "a string expected, got %s", api_type_name(user));
        /* thinking budget (Xing4 extension): reasoning tokens before </think> is forced */
        if (api_get_int(root, "thinking_budget", -1, INT32_MAX, &iv, &set, e) < 0)
                return -1;
        if (set)
                x4_request_set_thinking_budget(r->req, (int32_t) iv);
        /* ignore_eos (vLLM's and llama.cpp's extension): generate max_tokens, past end-of-turn */
        json_t *ie = json_object_get(root, "ignore_eos");
        if (ie && !json_is_null(ie)) {
                if (!json_is_boolean(ie))
                        return api_bad(e, "ignore_eos", "true or false expected, got %s", api_type_name(ie));
                x4_request_set_ignore_eos(r->req, json_is_true(ie));
        }
        return parse_stop(root, r->req, e);
}

int api_parse_format(const char *type, json_t *fmt, json_t *js, const char *param, const char *js_param,
                     struct api_request *r, struct api_error *e) {
        char p[96];
        if (streq(type, "text"))
                return 0;
        if (streq(type, "json_object")) {
                if (x4_request_set_constraint(r->req, X4_CONSTRAINT_JSON_OBJECT, NULL) < 0)
                        return OOM(e);
                return 0;
        }
        if (!streq(type, "json_schema")) {
                snprintf(p, sizeof p, "%s.type", param);
                return api_bad(e, p, "\"%s\": \"text\", \"json_object\" or \"json_schema\" expected", type);
        }
        if (!json_is_object(js)) {
                snprintf(p, sizeof p, "%s", js_param);
                return api_bad(e, p, "an object {name, schema, strict} expected, got %s", js ? api_type_name(js) : "nothing");
        }
        json_t *name = json_object_get(js, "name");
        snprintf(p, sizeof p, "%s.name", js_param);
        if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64 ||
            strspn(json_string_value(name), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                    json_string_length(name))
                return api_bad(e, p, "required: 1 to 64 of a-z, A-Z, 0-9, _ and -");
        json_t *schema = json_object_get(js, "schema");
        snprintf(p, sizeof p, "%s.schema", js_param);
        if (schema && !json_is_null(schema) && !json_is_object(schema))
                return api_bad(e, p, "a JSON Schema object expected, got %s", api_type_name(schema));
        json_t *strict = json_object_get(js, "strict");
        snprintf(p, sizeof p, "%s.strict", js_param);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
                return api_bad(e, p, "true or false expected, got %s", api_type_name(strict));
        if (!schema || json_is_null(schema)) {
                if (x4_request_set_constraint(r->req, X4_CONSTRAINT_JSON_OBJECT, NULL) < 0)
                        return OOM(e);
                return 0;
        }
        _cleanup_free_ char *text = json_dumps(schema, JSON_COMPACT);
        if (!text || x4_request_set_constraint(r->req, X4_CONSTRAINT_JSON_SCHEMA, text) < 0)
                return OOM(e);
        /* strict: true asks for the schema exactly (an unenforceable keyword is refused by name);
         * otherwise it is a hint, as OpenAI treats it: its structure is kept, keywords the mask
         * cannot enforce are ignored */
        if (!json_is_true(strict) && x4_request_set_constraint_lenient(r->req, true) < 0)
                return OOM(e);
        return 0;
}

static int parse_chat(json_t *root, struct api_request *r, struct api_error *e) {
        if (parse_messages(root, r, e) < 0)
                return -1;
        /* logprobs: bool + top_logprobs 0..20 */
        if (api_get_bool(root, "logprobs", &r->logprobs, e) < 0)
                return -1;
        json_int_t iv;
        bool set;
        if (api_get_int(root, "top_logprobs", 0, 20, &iv, &set, e) < 0)
                return -1;
        if (set) {
                if (!r->logprobs)
                        return api_bad(e, "top_logprobs", "requires \"logprobs\": true");
                r->top_logprobs = (unsigned) iv;
        }
        if (r->logprobs)
                x4_request_set_logprobs(r->req, r->top_logprobs > 0 ? r->top_logprobs : 1);

        /* the deprecated function-calling fields: dropping them would hide the functions from
         * the model, or a forced call, without a word (an empty list, "auto" and "none" change
         * nothing and pass) */
        json_t *fns = json_object_get(root, "functions"), *fcall = json_object_get(root, "function_call");
        if (fns && !json_is_null(fns) && !(json_is_array(fns) && json_array_size(fns) == 0))
                return api_unsupported(e, "functions", "the deprecated function-calling form (send \"tools\" "
                                       "and \"tool_choice\")");
        if (fcall && !json_is_null(fcall) && !streq(json_string_value(fcall), "auto") &&
            !streq(json_string_value(fcall), "none"))
                return api_unsupported(e, "function_call", "the deprecated function-calling form (send \"tools\" "
                                       "and \"tool_choice\")");
        json_t *tools = json_object_get(root, "tools");
        json_t *choice = json_object_get(root, "tool_choice");
        bool send_tools = tools && !json_is_null(tools);
        if (send_tools && !json_is_array(tools))
                return api_bad(e, "tools", "an array of {type: \"function\", function: {...}} expected");
        size_t i;
        json_t *t;
        if (send_tools)
                json_array_foreach(tools, i, t) {
                        if (!json_is_object(t) || !json_is_object(json_object_get(t, "function")) ||
                            !json_is_string(json_object_get(json_object_get(t, "function"), "name")))
                                return api_bad(e, "tools", "entry %zu: {type: \"function\", function: {name, "
                                               "description, parameters}} expected", i);
                }
        bool forced = false;
        if (choice && !json_is_null(choice)) {
                const char *c = json_string_value(choice);
                if (json_is_string(choice)) {
                        if (strcmp(c, "none") == 0)
                                r->no_calls = true;
                        else if (strcmp(c, "required") == 0)
                                forced = r->forced_tool = true;
                        else if (strcmp(c, "auto") != 0)
                                return api_bad(e, "tool_choice", "\"%s\": \"none\", \"auto\", \"required\" or "
                                               "{\"type\": \"function\", \"function\": {\"name\": ...}} expected", c);
                        if (forced && api_force_tool(r, NULL, e) < 0)
                                return -1;
                } else if (json_is_object(choice)) {
                        const char *type = json_string_value(json_object_get(choice, "type"));
                        const char *name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
                        if (!type || strcmp(type, "function") != 0)
                                return api_bad(e, "tool_choice.type", "\"function\" expected");
                        if (!name || !*name)
                                return api_bad(e, "tool_choice.function.name", "the name of one of the request's tools "
                                               "expected");
                        if (api_tool_named(send_tools ? tools : NULL, name, "tool_choice.function.name", e) < 0)
                                return -1;
                        forced = true;
                        if (api_force_tool(r, name, e) < 0)
                                return -1;
                } else
                        return api_bad(e, "tool_choice", "a string or an object expected, got %s", api_type_name(choice));
                if (forced && (!send_tools || json_array_size(tools) == 0))
                        return api_bad(e, "tool_choice", "forcing a tool call needs a non-empty \"tools\"");
        }
        bool parallel = true;
        if (api_get_bool(root, "parallel_tool_calls", &parallel, e) < 0)
                return -1;
        r->one_call = !parallel;
        if (send_tools && json_array_size(tools) > 0) {
                _cleanup_free_ char *s = json_dumps(tools, JSON_COMPACT);
                if (!s || x4_request_set_tools_json(r->req, s) < 0)
                        return OOM(e);
        }
        json_t *rf = json_object_get(root, "response_format");
        if (rf && !json_is_null(rf)) {
                if (!json_is_object(rf))
                        return api_bad(e, "response_format", "an object with a \"type\" expected, got %s",
                                       api_type_name(rf));
                const char *type = json_string_value(json_object_get(rf, "type"));
                if (!type)
                        return api_bad(e, "response_format.type", "\"text\", \"json_object\" or \"json_schema\" expected");
                if (!streq(type, "text") && forced)
                        return api_bad(e, "response_format", "a JSON answer cannot be combined with a forced tool "
                                       "call (tool_choice)");
                if (api_parse_format(type, rf, json_object_get(rf, "json_schema"), "response_format",
                                     "response_format.json_schema", r, e) < 0)
                        return -1;
        }
        r->thinking = true; /* the daemon's default (docs/model.md §7: the generation prompt opens <think>) */
        /* reasoning_effort: "none" / "minimal" turn the reasoning off (LiteLLM, Open WebUI and the
         * SDKs send it for that); low to xhigh keep it, unbounded; chat_template_kwargs wins */
        json_t *re = json_object_get(root, "reasoning_effort");
        if (re && !json_is_null(re)) {
                const char *v = json_string_value(re);
                if (streq(v, "none") || streq(v, "minimal")) {
                        r->thinking = false;
                        x4_request_set_thinking(r->req, false);
                } else if (!(streq(v, "low") || streq(v, "medium") || streq(v, "high") || streq(v, "xhigh")))
                        return api_bad(e, "reasoning_effort", "\"none\", \"minimal\", \"low\", \"medium\", \"high\" or "
                                       "\"xhigh\" expected");
        }
        json_t *kw = json_object_get(root, "chat_template_kwargs");
        if (kw && !json_is_null(kw)) {
                if (!json_is_object(kw))
                        return api_bad(e, "chat_template_kwargs", "an object expected");
                json_t *et = json_object_get(kw, "enable_thinking");
                if (et && !json_is_boolean(et))
                        return api_bad(e, "chat_template_kwargs.enable_thinking", "true or false expected");
                if (et) {
                        r->thinking = json_is_true(et);
                        x4_request_set_thinking(r->req, r->thinking);
                }
                json_int_t b;
                if (api_get_int(kw, "chat_template_kwargs.thinking_budget", -1, INT32_MAX, &b, &set, e) < 0)
                        return -1;
                if (set)
                        x4_request_set_thinking_budget(r->req, (int32_t) b);
        }
        /* continue_final_message / add_generation_prompt (vLLM's extensions): no generation
         * prompt, and a final assistant message is continued (an assistant prefill) */
        bool cont = false, agp = true;
        if (api_get_bool(root, "continue_final_message", &cont, e) < 0 ||
            api_get_bool(root, "add_generation_prompt", &agp, e) < 0)
                return -1;
        if (cont) {
                json_t *msgs = json_object_get(root, "messages");
                json_t *fin = json_array_get(msgs, json_array_size(msgs) - 1);
                if (agp && json_is_true(json_object_get(root, "add_generation_prompt")))
                        return api_bad(e, "continue_final_message", "cannot be combined with "
                                       "\"add_generation_prompt\": true");
                if (!streq(json_string_value(json_object_get(fin, "role")), "assistant"))
                        return api_bad(e, "continue_final_message", "the last message must be the assistant's "
                                       "to continue");
                /* a constrained answer is checked from its first token, not from inside a prefill */
                json_t *rf = json_object_get(root, "response_format");
                const char *rft = json_string_value(json_object_get(rf, "type"));
                if (r->forced_tool || (rft && !streq(rft, "text")))
                        return api_bad(e, "continue_final_message", "cannot be combined with %s",
                                       r->forced_tool ? "a forced tool call (tool_choice)" : "response_format");
        }
        if (cont || !agp)
                x4_request_set_add_generation_prompt(r->req, false);
        /* tool_choice auto (the default with tools): calls the model makes are held to the tools'
         * syntax; not after a prefill, which may have begun a call the mask did not see */
        const char *rft = json_string_value(json_object_get(rf, "type"));
        if (send_tools && json_array_size(tools) > 0 && !forced && !r->no_calls && !cont &&
            api_auto_tools(r, rft && !streq(rft, "text"), e) < 0)
                return -1;
        return 0;
}

static int parse_completion(json_t *root, struct api_request *r, struct api_error *e) {
        json_t *p = json_object_get(root, "prompt");
        if (!p)
                return api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "prompt",
                                "prompt: required (a string)");
        /* a batch of one prompt: ["text"] or [[ids]] (tiktoken-based clients send token lists) */
        if (json_is_array(p) && json_array_size(p) == 1 &&
            (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
                p = json_array_get(p, 0);
        if (json_is_string(p)) {
                struct sbuf text = { 0 };
                if (sbuf_add_text(&text, json_string_value(p), json_string_length(p)) < 0)
                        return OOM(e);
                api_affinity_add(r, text.s, text.len);
                int ret = x4_request_set_text(r->req, text.s);
                free(text.s);
                if (ret < 0)
                        return OOM(e);
        } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
                size_t n = json_array_size(p), i;
                _cleanup_free_ int32_t *ids = calloc(n, sizeof *ids);
                json_t *x;
                if (!ids)
                        return OOM(e);
                json_array_foreach(p, i, x) {
                        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
                                return api_bad(e, "prompt", "entry %zu: a token id expected", i);
                        ids[i] = (int32_t) json_integer_value(x);
                }
                api_affinity_add(r, (const char *) ids, n * sizeof *ids);
                if (x4_request_set_tokens(r->req, ids, n) < 0)
                        return OOM(e);
        } else
                return api_bad(e, "prompt", "a string, or an array of token ids, expected (one prompt per "
                           "request)");
        json_int_t iv;
        bool set, echo = false;
        if (api_get_int(root, "logprobs", 0, 20, &iv, &set, e) < 0)
                return -1;
        /* logprobs: 0 still asks for the sampled tokens' (with empty alternatives), as OpenAI's;
         * the daemon is asked for one alternative, which is then left out */
        if (set) {
                r->logprobs = true;
                r->top_logprobs = (unsigned) iv;
                x4_request_set_logprobs(r->req, (uint32_t) (iv > 0 ? iv : 1));
        }
        if (api_get_bool(root, "echo", &echo, e) < 0)
                return -1;
        if (echo)
                return api_unsupported(e, "echo", "echoing the prompt");
        json_t *suffix = json_object_get(root, "suffix");
        if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
                return api_unsupported(e, "suffix", "a suffix (fill-in-the-middle)");
        /* the legacy API's default output is 16 tokens, not the daemon's --max-tokens */
        json_t *mt = json_object_get(root, "max_tokens"), *mct = json_object_get(root, "max_completion_tokens");
        if ((!mt || json_is_null(mt)) && (!mct || json_is_null(mct)))
                x4_request_set_max_tokens(r->req, 16);
        if (api_get_int(root, "best_of", 1, 1 << 20, &iv, &set, e) < 0)
                return -1;
        if (set && iv != 1)
                return api_unsupported(e, "best_of", "best_of other than 1");
        return 0;
}

/* The integer that ends at or before byte `pos` of body (where jansson stopped on "too big
 * integer"): its start and length, when it is the value of the top-level object's "seed" (the one
 * field that takes the whole uint64 range). */
static bool big_seed_at(const char *body, size_t len, size_t pos, size_t *start, size_t *n) {
        size_t end = pos < len ? pos : len, depth = 0;
        while (end > 0 && !(body[end - 1] >= '0' && body[end - 1] <= '9'))
                end--;
        size_t b = end;
        while (b > 0 && body[b - 1] >= '0' && body[b - 1] <= '9')
                b--;
        if (b == end)
                return false;
        /* the depth there: only a top-level key (strings skipped, escapes included) */
        bool in_str = false;
        for (size_t i = 0; i < b; i++) {
                char c = body[i];
                if (in_str) {
                        if (c == '\\')
                                i++;
                        else if (c == '"')
                                in_str = false;
                } else if (c == '"')
                        in_str = true;
                else if (c == '{' || c == '[')
                        depth++;
                else if (c == '}' || c == ']')
                        depth--;
        }
        size_t k = b;
        while (k > 0 && body[k - 1] && strchr(" \t\r\n", body[k - 1]))
                k--;
        if (depth != 1 || k == 0 || body[k - 1] != ':')
                return false;
        k--;
        while (k > 0 && body[k - 1] && strchr(" \t\r\n", body[k - 1]))
                k--;
        if (k < 6 || memcmp(body + k - 6, "\"seed\"", 6) != 0)
                return false;
        *start = b;
        *n = end - b;
        return true;
}

json_t *api_load_body(const char *body, size_t len, struct api_error *e) {
        json_error_t je;
        /* \u0000 is valid JSON; the text it sits in is mended where it goes to the model */
        json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &je);
        size_t start, n;
        if (!root && strstr(je.text, "too big integer") && big_seed_at(body, len, (size_t) je.position, &start, &n)) {
                /* a seed in [2^63, 2^64) (jansson's integers are signed 64-bit): parsed again with it
                 * written as the int64 of the same bits, which the seed's cast gives back */
                char digits[32];
                unsigned long long v = 0;
                if (n < sizeof digits) {
                        memcpy(digits, body + start, n);
                        digits[n] = 0;
                        errno = 0;
                        v = strtoull(digits, NULL, 10);
                }
                if (n >= sizeof digits || errno == ERANGE) {
                        api_fail(e, 400, "invalid_request_error", "integer_out_of_range", "seed",
                                 "seed: %.*s%s is out of range: an integer from -9223372036854775808 to "
                                 "18446744073709551615 expected", (int) (n > 40 ? 40 : n), body + start,
                                 n > 40 ? "..." : "");
                        return NULL;
                }
                char wrapped[32];
                int w = snprintf(wrapped, sizeof wrapped, "%lld", (long long) v);
                struct sbuf b = { 0 };
                if (sbuf_add(&b, body, start) < 0 || sbuf_add(&b, wrapped, (size_t) w) < 0 ||
                    sbuf_add(&b, body + start + n, len - start - n) < 0) {
                        free(b.s);
                        OOM(e);
                        return NULL;
                }
                root = json_loadb(b.s, b.len, JSON_ALLOW_NUL, &je);
                free(b.s);
        }
        if (!root) {
                if (strstr(je.text, "too big integer")) /* valid JSON, past what a 64-bit field holds */
                        api_fail(e, 400, "invalid_request_error", "integer_out_of_range", NULL,
                                 "request body: the integer at line %d, column %d is out of range: integers "
                                 "(max_tokens, ...) must lie in [-2^63, 2^63), a seed in [-2^63, 2^64)",
                                 je.line, je.column);
                else
                        api_fail(e, 400, "invalid_request_error", "invalid_json", NULL,
                                 "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                                 je.column);
                return NULL;
        }
        if (!json_is_object(root)) {
                api_fail(e, 400, "invalid_request_error", "invalid_json", NULL,
                         "request body must be a JSON object, got %s", api_type_name(root));
                json_decref(root);
                return NULL;
        }
        return root;
}

int api_check_model(json_t *root, const struct api_config *cfg, bool required, const char **name,
                    struct api_error *e) {
        json_t *model = json_object_get(root, "model");
        *name = cfg->model_id;
        if (!model || json_is_null(model)) {
                if (!required)
                        return 0;
                return api_fail(e, 400, "invalid_request_error", "missing_required_parameter", "model",
                                "model: required; this server serves \"%s\"", cfg->model_id);
        }
        if (!json_is_string(model))
                return api_bad(e, "model", "a string expected, got %s", api_type_name(model));
        const char *m = json_string_value(model);
        if (streq(m, cfg->model_id)) {
                *name = m;
                return 0;
        }
        for (size_t i = 0; i < cfg->n_aliases; i++)
                if (fnmatch(cfg->aliases[i], m, 0) == 0) {
                        *name = m;
                        return 0;
                }
        return api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                        "The model \"%.200s\" does not exist; this server serves \"%s\" (GET /v1/models)%s", m,
                        cfg->model_id, cfg->n_aliases ? " and the names its model-alias patterns match" : "");
}

void api_call_id(char *buf, size_t size, const char *prefix, const char *response_id, size_t index) {
        const char *hex = response_id + strcspn(response_id, "-_");
        hex += *hex != 0;
        snprintf(buf, size, "%s%.24s_%zu", prefix, hex, index);
}

int api_add_conversation(struct api_request *r, json_t *conv, struct api_error *e) {
        size_t i;
        json_t *m;
        json_array_foreach(conv, i, m) {
                const char *role = json_string_value(json_object_get(m, "role"));
                json_t *content = json_object_get(m, "content");
                json_t *calls = json_object_get(m, "tool_calls");
                struct sbuf text = { 0 };
                _cleanup_free_ char *calls_json = calls ? json_dumps(calls, JSON_COMPACT) : NULL;
                if (sbuf_add_text(&text, json_string_value(content) ? json_string_value(content) : "",
                                  json_string_length(content)) < 0 ||
                    (calls && !calls_json)) {
                        free(text.s);
                        return OOM(e);
                }
                api_affinity_add(r, text.s, text.len);
                if (calls_json)
                        api_affinity_add(r, calls_json, strlen(calls_json));
                int ret = x4_request_add_message_ex(r->req, role ? role : "user", text.s,
                                                    json_string_value(json_object_get(m, "reasoning")),
                                                    calls_json, json_string_value(json_object_get(m, "name")));
                free(text.s);
                if (ret < 0)
                        return OOM(e);
        }
        return 0;
}

int api_parse_request(enum api_kind kind, const char *body, size_t len, const struct api_config *cfg,
                      struct api_request *r, struct api_error *e) {
        memset(r, 0, sizeof *r);
        memset(e, 0, sizeof *e);
        r->kind = kind;
        json_t *root = api_load_body(body, len, e);
        if (!root)
                return -1;
        int ret = -1;
        const char *model;
        if (api_check_model(root, cfg, true, &model, e) < 0)
                goto out;
        r->req = x4_request_new();
        /* chat and completions answer with the served id (as they always have); the others with
         * the name the client asked for, which agents check */
        r->model = strdup(kind == API_CHAT || kind == API_COMPLETION ? cfg->model_id : model);
        if (!r->req || !r->model) {
                OOM(e);
                goto out;
        }
        if (kind == API_MESSAGES || kind == API_COUNT_TOKENS) {
                ret = am_parse(root, kind == API_COUNT_TOKENS, r, e);
                goto out;
        }
        if (kind == API_RESPONSES) {
                ret = rs_parse(root, cfg, r, e);
                goto out;
        }
        if (api_get_bool(root, "stream", &r->stream, e) < 0)
                goto out;
        json_t *so = json_object_get(root, "stream_options");
        if (so && !json_is_null(so)) {
                if (!json_is_object(so)) {
                        api_bad(e, "stream_options", "an object expected");
                        goto out;
                }
                if (!r->stream) {
                        api_bad(e, "stream_options", "only allowed when \"stream\" is true");
                        goto out;
                }
                if (api_get_bool(so, "stream_options.include_usage", &r->include_usage, e) < 0)
                        goto out;
        }
        if (parse_sampling(root, r, e) < 0)
                goto out;
        if ((kind == API_CHAT ? parse_chat(root, r, e) : parse_completion(root, r, e)) < 0)
                goto out;
        ret = 0;
out:
        json_decref(root);
        if (ret < 0)
                api_request_done(r);
        return ret;
}

/* ---- results ------------------------------------------------------------------------------------- */

void api_result_done(struct api_result *r) {
        free(r->content);
        free(r->reasoning);
        for (size_t i = 0; i < r->n_calls; i++) {
                free(r->calls[i].name);
                free(r->calls[i].arguments);
        }
        free(r->calls);
        json_decref(r->logprobs);
        json_decref(r->lp_pending);
        memset(r, 0, sizeof *r);
}

int api_result_add_text(struct api_result *r, bool reasoning, const char *text, size_t len) {
        struct sbuf b = { reasoning ? r->reasoning : r->content, reasoning ? r->reasoning_len : r->content_len,
                          reasoning ? r->reasoning_cap : r->content_cap };
        int ret = sbuf_add(&b, text, len);
        if (reasoning)
                r->reasoning = b.s, r->reasoning_len = b.len, r->reasoning_cap = b.cap;
        else
                r->content = b.s, r->content_len = b.len, r->content_cap = b.cap;
        return ret;
}

int api_result_add_call(struct api_result *r, const char *name, const char *args) {
        struct tool_call_out *n = realloc(r->calls, (r->n_calls + 1) * sizeof *n);
        if (!n)
                return -1;
        r->calls = n;
        n[r->n_calls].name = strdup(name ? name : "");
        n[r->n_calls].arguments = strdup(args ? args : "{}");
        r->n_calls++;
        return 0;
}

/* The bytes of a token's text, as OpenAI's "bytes" field. */
static json_t *bytes_of(const char *s) {
        json_t *a = json_array();
        for (; s && *s; s++)
                json_array_append_new(a, json_integer((unsigned char) *s));
        return a;
}

/* An alternative's text; the daemon may leave it out (TopLogprob.text is optional), and the bridge
 * has no tokenizer, so it is then named by its id. */
static const char *top_text(const struct x4_top_logprob *t, char *buf, size_t size) {
        if (t->text)
                return t->text;
        snprintf(buf, size, "<token %d>", t->token_id);
        return buf;
}

static const char *token_text(const struct x4_token_logprob *lp, const struct x4_chunk *c) {
        for (size_t j = 0; j < lp->n_top; j++)
                if (lp->top[j].token_id == lp->token_id && lp->top[j].text)
                        return lp->top[j].text;
        return c->n_logprobs == 1 && c->text ? c->text : "";
}

static json_t *chat_logprob_entries(const struct x4_chunk *c, unsigned top_n) {
        json_t *arr = json_array();
        for (size_t i = 0; i < c->n_logprobs; i++) {
                const struct x4_token_logprob *lp = &c->logprobs[i];
                const char *t = token_text(lp, c);
                json_t *top = json_array();
                for (size_t j = 0; j < lp->n_top && j < top_n; j++) {
                        char buf[32];
                        const char *tt = lp->top[j].token_id == lp->token_id ? t : top_text(&lp->top[j], buf, sizeof buf);
                        json_array_append_new(top, json_pack("{s:s, s:f, s:o}", "token", tt, "logprob",
                                                             (double) lp->top[j].logprob, "bytes", bytes_of(tt)));
                }
                json_array_append_new(arr, json_pack("{s:s, s:f, s:o, s:o}", "token", t, "logprob",
                                                     (double) lp->logprob, "bytes", bytes_of(t),
                                                     "top_logprobs", top));
        }
        return arr;
}

/* Characters (code points) of UTF-8 text, as OpenAI counts text_offset. */
static size_t utf8_chars(const char *s, size_t n) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
                k += ((unsigned char) s[i] & 0xC0) != 0x80;
        return k;
}

/* text_offset: where each token starts in the output, in characters; a chunk's tokens advance by
 * their own texts, and the chunk's end lands where its text ends (a character split over byte
 * tokens comes out whole in the chunk's text). */
static void completion_logprobs_append(json_t *obj, const struct x4_chunk *c, unsigned top_n, size_t *text_offset) {
        json_t *tokens = json_object_get(obj, "tokens"), *lps = json_object_get(obj, "token_logprobs"),
               *tops = json_object_get(obj, "top_logprobs"), *offs = json_object_get(obj, "text_offset");
        size_t base = *text_offset, at = base, end = base + utf8_chars(c->text ? c->text : "", c->text_len);
        for (size_t i = 0; i < c->n_logprobs; i++) {
                const struct x4_token_logprob *lp = &c->logprobs[i];
                const char *t = token_text(lp, c);
                json_array_append_new(offs, json_integer((json_int_t) (at < end ? at : end)));
                at += utf8_chars(t, strlen(t));
                json_array_append_new(tokens, json_string(t));
                json_array_append_new(lps, json_real(lp->logprob));
                json_t *top = json_object();
                bool sampled = false;
                for (size_t j = 0; j < lp->n_top && j < top_n; j++) {
                        char buf[32];
                        sampled = sampled || lp->top[j].token_id == lp->token_id;
                        json_object_set_new(top, lp->top[j].token_id == lp->token_id ? token_text(lp, c)
                                                                                     : top_text(&lp->top[j], buf, sizeof buf),
                                            json_real(lp->top[j].logprob));
                }
                /* OpenAI's "up to logprobs + 1": the sampled token is there even when it is not among
                 * the most likely */
                if (top_n > 0 && !sampled)
                        json_object_set_new(top, t, json_real(lp->logprob));
                json_array_append_new(tops, top);
        }
        *text_offset = end;
}

static json_t *completion_logprobs_new(void) {
        return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                         "text_offset");
}

/* Whether the tokens of entries [from, end) join to exactly text. */
static bool entries_spell(json_t *entries, size_t from, const char *text, size_t len) {
        size_t at = 0;
        for (size_t i = from; i < json_array_size(entries); i++) {
                json_t *t = json_object_get(json_array_get(entries, i), "token");
                size_t n = json_string_length(t);
                if (at + n > len || memcmp(text + at, json_string_value(t), n) != 0)
                        return false;
                at += n;
        }
        return at == len;
}

#define LP_PENDING_MAX 64

/* Chat: the entries of logprobs.content a content chunk adds (api_chunk_logprobs); NULL for
 * none. */
static json_t *chat_content_entries(struct api_result *r, const struct x4_chunk *c, unsigned top_n) {
        if (c->channel != X4_CHANNEL_CONTENT || (c->n_logprobs == 0 && !c->text_len))
                return NULL;
        if (!r->lp_pending && !(r->lp_pending = json_array()))
                return NULL;
        json_t *entries = chat_logprob_entries(c, top_n);
        json_array_extend(r->lp_pending, entries);
        json_decref(entries);
        size_t n = json_array_size(r->lp_pending);
        if (!c->text_len) {
                /* no text yet: a special token or text held back; bounded, oldest dropped */
                while (json_array_size(r->lp_pending) > LP_PENDING_MAX)
                        json_array_remove(r->lp_pending, 0);
                return NULL;
        }
        /* the longest run of the latest tokens that spells the text (the earlier ones made no text:
         * </think> and the like); none: all of them, as the daemon gave them */
        size_t from = 0;
        while (from < n && !entries_spell(r->lp_pending, from, c->text, c->text_len))
                from++;
        if (from == n)
                from = 0;
        json_t *out = json_array();
        for (size_t i = from; i < n; i++)
                json_array_append(out, json_array_get(r->lp_pending, i));
        json_array_clear(r->lp_pending);
        return out;
}

void api_result_add_logprobs(struct api_result *r, enum api_kind kind, const struct x4_chunk *c,
                             unsigned top_n) {
        if (kind == API_COMPLETION && c->n_logprobs == 0)
                r->text_offset += utf8_chars(c->text ? c->text : "", c->text_len);
        if (kind == API_CHAT) {
                json_t *entries = chat_content_entries(r, c, top_n);
                if (!r->logprobs)
                        r->logprobs = json_array();
                if (entries)
                        json_array_extend(r->logprobs, entries);
                json_decref(entries);
                return;
        }
        if (c->n_logprobs == 0)
                return;
        if (!r->logprobs)
                r->logprobs = completion_logprobs_new();
        completion_logprobs_append(r->logprobs, c, top_n, &r->text_offset);
}

json_t *api_chunk_logprobs(enum api_kind kind, const struct x4_chunk *c, unsigned top_n, struct api_result *r) {
        if (kind == API_COMPLETION && c->n_logprobs == 0)
                r->text_offset += utf8_chars(c->text ? c->text : "", c->text_len);
        if (kind == API_CHAT) {
                json_t *entries = chat_content_entries(r, c, top_n);
                if (entries && json_array_size(entries) == 0) {
                        json_decref(entries);
                        entries = NULL;
                }
                return entries ? json_pack("{s:o}", "content", entries) : NULL;
        }
        if (c->n_logprobs == 0)
                return NULL;
        json_t *o = completion_logprobs_new();
        completion_logprobs_append(o, c, top_n, &r->text_offset);
        return o;
}

const char *api_finish_reason(int f, bool had_tool_calls) {
        switch (f) {
        case X4_FINISH_LENGTH:
                return "length";
        case X4_FINISH_TOOL_CALLS:
                return "tool_calls";
        default:
                /* the model may end its turn right after a call without the daemon saying so */
                return had_tool_calls ? "tool_calls" : "stop";
        }
}

json_t *api_usage_json(const struct x4_done *d) {
        return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:I}}", "prompt_tokens", (json_int_t) d->prompt_tokens,
                         "completion_tokens", (json_int_t) d->completion_tokens, "total_tokens",
                         (json_int_t) d->prompt_tokens + d->completion_tokens, "prompt_tokens_details",
                         "cached_tokens", (json_int_t) d->cached_tokens, "completion_tokens_details",
                         "reasoning_tokens", (json_int_t) d->reasoning_tokens);
}

static json_t *string_or_null(const char *s, size_t n) {
        return s ? json_stringn(s, n) : json_null();
}

json_t *api_response_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                          const struct api_result *res, const struct x4_done *d) {
        json_t *choice;
        const char *finish = api_finish_reason(d->finish_reason, res->n_calls > 0);
        if (kind == API_CHAT) {
                json_t *msg = json_pack("{s:s}", "role", "assistant");
                if (res->content || res->n_calls == 0)
                        json_object_set_new(msg, "content", json_stringn(res->content ? res->content : "",
                                                                         res->content_len));
                else
                        json_object_set_new(msg, "content", json_null());
                if (res->reasoning) {
                        json_object_set_new(msg, "reasoning_content",
                                            string_or_null(res->reasoning, res->reasoning_len));
                        json_object_set_new(msg, "reasoning", string_or_null(res->reasoning, res->reasoning_len));
                }
                if (res->n_calls > 0) {
                        json_t *calls = json_array();
                        for (size_t i = 0; i < res->n_calls; i++) {
                                char cid[64];
                                api_call_id(cid, sizeof cid, "call_", id, i);
                                json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cid,
                                                                       "type", "function", "function", "name",
                                                                       res->calls[i].name, "arguments",
                                                                       res->calls[i].arguments));
                        }
                        json_object_set_new(msg, "tool_calls", calls);
                }
                choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs",
                                   json_null(), "finish_reason", finish);
                if (res->logprobs) {
                        json_object_set_new(choice, "logprobs", json_pack("{s:O}", "content", res->logprobs));
                }
        } else {
                choice = json_pack("{s:s%, s:i, s:O, s:s}", "text", res->content ? res->content : "",
                                   res->content_len, "index", 0, "logprobs",
                                   res->logprobs ? res->logprobs : json_null(), "finish_reason", finish);
        }
        return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
                         kind == API_CHAT ? "chat.completion" : "text_completion", "created",
                         (json_int_t) created, "model", model, "choices", choice, "usage", api_usage_json(d));
}

json_t *api_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                       json_t *delta, const char *finish_reason, json_t *logprobs) {
        json_t *choice;
        json_t *fr = finish_reason ? json_string(finish_reason) : json_null();
        json_t *lp = logprobs ? logprobs : json_null();
        if (kind == API_CHAT)
                choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta ? delta : json_object(),
                                   "logprobs", lp, "finish_reason", fr);
        else {
                /* completions: delta is a JSON string (the text) */
                choice = json_pack("{s:o, s:i, s:o, s:o}", "text", delta ? delta : json_string(""), "index", 0,
                                   "logprobs", lp, "finish_reason", fr);
        }
        return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
                         kind == API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                         (json_int_t) created, "model", model, "choices", choice);
}

json_t *api_usage_chunk_json(enum api_kind kind, const char *id, int64_t created, const char *model,
                             const struct x4_done *d) {
        return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                         kind == API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                         (json_int_t) created, "model", model, "choices", "usage", api_usage_json(d));
}
